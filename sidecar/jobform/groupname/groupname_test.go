package groupname

import "testing"

func TestParse(t *testing.T) {
	for name, want := range map[string]Worker{
		"train-hadar-u0-w0":         {"train", 0, 0},
		"a-b-hadar-u12-w3":          {"a-b", 12, 3},
		"a-b-hadar-u12-w7":          {"a-b", 12, 7},
		"x-hadar-u1-w1-hadar-u2-w0": {"x-hadar-u1-w1", 2, 0},
	} {
		if got, ok := Parse(name); !ok || got != want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", name, got, ok, want)
		}
		if got := want.Name(); got != name {
			t.Errorf("%+v.Name() = %q, want %q", want, got, name)
		}
	}
	for _, name := range []string{"train", "train-hadar-u-w0", "train-hadar-u1", "train-hadar-u1-w", "-hadar-u0-w0", "train-hadar-u0-w0x", "train-hadar-u99999999999999999999-w0"} {
		if w, ok := Parse(name); ok {
			t.Errorf("Parse(%q) accepted: %+v", name, w)
		}
	}
}

// Format and Parse are inverses.
func TestFormatParse(t *testing.T) {
	if got := Format("x", 3, 4); got != "x-hadar-u3-w4" {
		t.Fatal(got)
	}
	for _, w := range []Worker{{"train", 0, 0}, {"t", 7, 31}, {"a-hadar-u1-w2", 3, 4}} {
		if got, ok := Parse(Format(w.Template, w.Unit, w.Rank)); !ok || got != w {
			t.Errorf("Parse(Format(%+v)) = %+v, %v", w, got, ok)
		}
	}
}
