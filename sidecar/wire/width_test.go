package wire

import "testing"

func TestWorkersText(t *testing.T) {
	for _, c := range []struct {
		workers int
		widths  []int
		at      int
		want    string
	}{
		{4, nil, 4, "4 workers"},
		{1, nil, 0, "1 workers"},
		{2, []int{2, 3, 4, 5, 6, 7, 8}, 4, "4 of 2-8 workers"},
		{1, []int{1, 2}, 0, "1-2 workers"},
		{2, []int{2, 4, 8}, 8, "8 of 2,4,8 workers"},
		{2, []int{2, 3, 5}, 3, "3 of 2,3,5 workers"},
	} {
		if got := WorkersText(c.workers, c.widths, c.at); got != c.want {
			t.Errorf("WorkersText(%d, %v, %d) = %q, want %q", c.workers, c.widths, c.at, got, c.want)
		}
	}
	if w := Width([]UnitView{{Slots: []SlotView{{Count: 2}, {Count: 1}}}, {Slots: []SlotView{{Count: 3}}}}); w != 6 {
		t.Errorf("Width = %d, want 6", w)
	}
}
