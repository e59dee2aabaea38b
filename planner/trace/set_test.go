package trace_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/trace"
)

func TestQueueAndPriorityColumns(t *testing.T) {
	src := "id,model,scale_factor,total_steps,weight,arrival_s,slo_s,queue,priority\n" +
		"a,m,1,10,1,0,0,team-a,70\n" +
		"b,m,2,10,1,5,0,,\n"
	jobs, err := trace.Parse(strings.NewReader(src))
	if err != nil {
		t.Fatal(err)
	}
	if jobs[0].Queue != "team-a" || jobs[0].Priority != 70 || jobs[1].Queue != "" || jobs[1].Priority != 0 {
		t.Fatalf("read %+v", jobs)
	}
	// Round trip: the columns are written when a job needs them, and
	// not otherwise (a trace without queues reads and writes as before).
	var buf bytes.Buffer
	if err := trace.Write(&buf, jobs); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "id,model,scale_factor,total_steps,weight,arrival_s,slo_s,queue,priority\n") {
		t.Fatalf("wrote %q", buf.String())
	}
	back, err := trace.Parse(&buf)
	if err != nil || !reflect.DeepEqual(back[:2], jobs[:2]) {
		t.Fatalf("read back %+v (%v)", back, err)
	}
	buf.Reset()
	if err := trace.Write(&buf, []planner.Job{{ID: "x", Model: "m", ScaleFactor: 1, TotalSteps: 1, Weight: 1, Queue: "q"}}); err != nil {
		t.Fatal(err)
	}
	if head, _, _ := strings.Cut(buf.String(), "\n"); head != "id,model,scale_factor,total_steps,weight,arrival_s,slo_s,queue" {
		t.Fatalf("header %q: want the queue column alone", head)
	}
	for _, c := range []struct{ src, want string }{
		{"id,model,scale_factor,total_steps,weight,arrival_s,slo_s,priority,queue\n", "optionally followed by queue and priority"},
		{"id,model,scale_factor,total_steps,weight,arrival_s,slo_s,queue,queue\n", "optionally followed"},
		{"id,model,scale_factor,total_steps,weight,arrival_s,slo_s,team\n", "optionally followed"},
		{"id,model,scale_factor,total_steps,weight,arrival_s,slo_s,queue\na,m,1,10,1,0,0,bad queue\n", `queue "bad queue"`},
		{"id,model,scale_factor,total_steps,weight,arrival_s,slo_s,priority\na,m,1,10,1,0,0,-4\n", `priority "-4"`},
		{"id,model,scale_factor,total_steps,weight,arrival_s,slo_s,queue\na,m,1,10,1,0,0\n", "7 columns: want 8"},
	} {
		if _, err := trace.Parse(strings.NewReader(c.src)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error containing %q", c.src, err, c.want)
		}
	}
}

func TestLoadSetMapsFilesToQueues(t *testing.T) {
	dir := t.TempDir()
	gavel := filepath.Join("testdata", "gavel", "small_test.trace")
	csv := filepath.Join(dir, "team.csv")
	if err := os.WriteFile(csv, []byte("id,model,scale_factor,total_steps,weight,arrival_s,slo_s\nx,m,1,10,1,3,0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	one, err := trace.Load(gavel)
	if err != nil {
		t.Fatal(err)
	}
	// One file: the IDs as Load gives them, the queue set.
	jobs, lines, err := trace.LoadSet(gavel + "@vc-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != len(one) || jobs[0].ID != one[0].ID || jobs[0].Queue != "vc-a" || lines.Format != trace.FormatGavel {
		t.Fatalf("one file: %d jobs, first %+v", len(jobs), jobs[0])
	}
	// Two: IDs prefixed by the file's name, each file's queue.
	jobs, lines, err = trace.LoadSet(gavel + "@vc-a," + csv + "@vc-b")
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != len(one)+1 || lines.Format != "mixed" {
		t.Fatalf("%d jobs, format %q", len(jobs), lines.Format)
	}
	seen := map[string]string{}
	for _, j := range jobs {
		seen[j.ID] = j.Queue
	}
	if seen["small_test/"+one[0].ID] != "vc-a" || seen["team/x"] != "vc-b" {
		t.Fatalf("jobs %v", seen)
	}
	if w := lines.Where("team/x"); w != csv+":2" {
		t.Fatalf("where %q, want %s:2", w, csv)
	}
	for _, c := range []struct{ spec, want string }{
		{"", "no file"},
		{"@q", "has no file"},
		{gavel + "@bad queue", "queue \"bad queue\""},
		{gavel + "," + gavel, "also in an earlier file"},
	} {
		if _, _, err := trace.LoadSet(c.spec); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error containing %q", c.spec, err, c.want)
		}
	}
	// A row naming another queue than its file's is refused.
	named := filepath.Join(dir, "named.csv")
	if err := os.WriteFile(named, []byte("id,model,scale_factor,total_steps,weight,arrival_s,slo_s,queue\nx,m,1,10,1,3,0,vc-c\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := trace.LoadSet(named + "@vc-b"); err == nil || !strings.Contains(err.Error(), `is in queue "vc-c"`) {
		t.Fatalf("got %v", err)
	}
	if jobs, _, err := trace.LoadSet(named); err != nil || jobs[0].Queue != "vc-c" {
		t.Fatalf("without a mapping the row's queue stands: %+v %v", jobs, err)
	}
}
