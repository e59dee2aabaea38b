package wire

import "testing"

func TestInNamespace(t *testing.T) {
	p := PlanView{Jobs: []JobView{{JobIdentity: JobIdentity{ID: "default/a"}}, {JobIdentity: JobIdentity{ID: "team/b"}}, {JobIdentity: JobIdentity{ID: "team-2/c"}}},
		Refused: []RefusedJob{{Job: "team/bad"}, {Job: "default/bad"}}}
	got := p.InNamespace("team")
	if len(got.Jobs) != 1 || got.Jobs[0].ID != "team/b" || len(got.Refused) != 1 || got.Refused[0].Job != "team/bad" {
		t.Fatalf("InNamespace(team) = %+v", got)
	}
	if got := p.InNamespace(""); len(got.Jobs) != 3 || len(got.Refused) != 2 {
		t.Fatalf("every namespace: %+v", got)
	}
}
