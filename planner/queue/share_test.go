package queue

import (
	"slices"
	"testing"
)

// one GPU type unless said: jobs run everywhere at 1 step/s.
func waiting(sf int, types int) demand {
	tp := make([]float64, types)
	for t := range tp {
		tp[t] = 1
	}
	return demand{sf: sf, tp: tp}
}

func running(held ...int) demand {
	sf := 0
	for _, k := range held {
		sf += k
	}
	d := waiting(sf, len(held))
	d.held = held
	return d
}

func none(n int) []int {
	out := make([]int, n)
	for t := range out {
		out[t] = -1
	}
	return out
}

func TestShare(t *testing.T) {
	type q struct {
		guar, limit []int
		weight      float64
		jobs        []demand
	}
	for _, c := range []struct {
		name   string
		base   []int
		queues []q
		static bool
		// want is each queue's counted GPUs per type; counted each
		// queue's claims' counted flags.
		want    [][]int
		counted [][]bool
		limited [][]bool
	}{
		{
			name: "an idle guarantee is lent",
			base: []int{8},
			queues: []q{
				{guar: []int{0}, limit: none(1), weight: 1, jobs: []demand{waiting(4, 1), waiting(4, 1)}},
				{guar: []int{4}, limit: none(1), weight: 1},
			},
			want:    [][]int{{8}, {0}},
			counted: [][]bool{{true, true}, {}},
		},
		{
			name: "the owner's demand comes first: the borrower's running job is left out",
			base: []int{8},
			queues: []q{
				{guar: []int{0}, limit: none(1), weight: 1, jobs: []demand{running(4), running(4)}},
				{guar: []int{4}, limit: none(1), weight: 1, jobs: []demand{waiting(2, 1), waiting(2, 1)}},
			},
			want:    [][]int{{4}, {4}},
			counted: [][]bool{{true, false}, {true, true}},
		},
		{
			name: "what guarantees leave goes by weight, 2:1",
			base: []int{9},
			queues: []q{
				{guar: []int{0}, limit: none(1), weight: 2, jobs: slices.Repeat([]demand{waiting(1, 1)}, 9)},
				{guar: []int{0}, limit: none(1), weight: 1, jobs: slices.Repeat([]demand{waiting(1, 1)}, 9)},
			},
			want: [][]int{{6}, {3}},
		},
		{
			name: "borrowed GPUs are counted per type as a share of the type",
			base: []int{4, 16},
			queues: []q{
				// Queue 0 holds all 4 GPUs of type 0: a quarter of the
				// fleet's worth of type 0 alone.
				{guar: []int{0, 0}, limit: none(2), weight: 1, jobs: append([]demand{running(4, 0)}, slices.Repeat([]demand{{sf: 1, tp: []float64{0, 1}}}, 16)...)},
				{guar: []int{0, 0}, limit: none(2), weight: 1, jobs: slices.Repeat([]demand{{sf: 1, tp: []float64{0, 1}}}, 16)},
			},
			// Queue 0 borrows 4/4 of type 0 = share 1; type 1 goes
			// to queue 1 until its share (n/16) reaches 1.
			want: [][]int{{4, 0}, {0, 16}},
		},
		{
			name: "a limit caps borrowing and says so",
			base: []int{8},
			queues: []q{
				{guar: []int{2}, limit: []int{3}, weight: 1, jobs: []demand{waiting(2, 1), waiting(1, 1), waiting(2, 1)}},
			},
			want:    [][]int{{3}},
			counted: [][]bool{{true, true, false}},
			limited: [][]bool{{false, false, true}},
		},
		{
			name:   "static: the guarantee and nothing more",
			base:   []int{8},
			static: true,
			queues: []q{
				{guar: []int{4}, limit: none(1), weight: 1, jobs: slices.Repeat([]demand{waiting(2, 1)}, 4)},
				{guar: []int{4}, limit: none(1), weight: 1},
			},
			want:    [][]int{{4}, {0}},
			counted: [][]bool{{true, true, false, false}, {}},
		},
		{
			name: "a job too wide for what is left lets a narrower one borrow",
			base: []int{8},
			queues: []q{
				{guar: []int{0}, limit: none(1), weight: 1, jobs: []demand{waiting(6, 1), waiting(4, 1), waiting(2, 1)}},
			},
			want:    [][]int{{8}},
			counted: [][]bool{{true, false, true}},
		},
		{
			name: "mid-round, running jobs are counted whatever the room",
			base: []int{8},
			queues: []q{
				{guar: []int{0}, limit: none(1), weight: 1, jobs: []demand{{held: []int{8}, sf: 8, tp: []float64{1}, fixed: true}}},
				{guar: []int{4}, limit: none(1), weight: 1, jobs: []demand{waiting(4, 1)}},
			},
			// Queue 1's job is counted within its guarantee: it waits
			// for the reclaim at the next boundary.
			want:    [][]int{{8}, {4}},
			counted: [][]bool{{true}, {true}},
		},
		{
			name: "a waiting job is counted on its fastest type with guarantee left",
			base: []int{4, 4},
			queues: []q{
				{guar: []int{2, 4}, limit: none(2), weight: 1, jobs: []demand{{sf: 2, tp: []float64{1, 3}}, {sf: 2, tp: []float64{1, 3}}, {sf: 2, tp: []float64{1, 3}}}},
			},
			want: [][]int{{2, 4}},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			var accts []*account
			for _, qq := range c.queues {
				accts = append(accts, newAccount(len(c.base), qq.guar, qq.limit, qq.weight, qq.jobs))
			}
			share(accts, c.base, c.static)
			for k, a := range accts {
				got := a.entitled()
				if !slices.Equal(got, c.want[k]) {
					t.Fatalf("queue %d counted for %v, want %v (guaranteed %v, borrowed %v)", k, got, c.want[k], a.gu, a.bo)
				}
				for j, cl := range a.claims {
					if c.counted != nil && j < len(c.counted[k]) && cl.counted != c.counted[k][j] {
						t.Fatalf("queue %d job %d counted=%v, want %v", k, j, cl.counted, c.counted[k][j])
					}
					if c.limited != nil && j < len(c.limited[k]) && cl.atLimit != c.limited[k][j] {
						t.Fatalf("queue %d job %d at limit=%v, want %v", k, j, cl.atLimit, c.limited[k][j])
					}
				}
			}
			// No type is ever counted beyond what there is, except for
			// fixed jobs mid-round (they hold it already).
			for ty := range c.base {
				sum, fixed := 0, false
				for _, a := range accts {
					sum += a.gu[ty] + a.bo[ty]
					for _, d := range a.jobs {
						fixed = fixed || d.fixed
					}
				}
				if sum > c.base[ty] && !fixed {
					t.Fatalf("type %d: %d counted of %d", ty, sum, c.base[ty])
				}
			}
		})
	}
}

func TestSpreadGivesIdleGPUsToTheQueueBorrowingLeast(t *testing.T) {
	base := []int{8, 8}
	a := newAccount(2, []int{0, 0}, none(2), 1, []demand{running(2, 0)})
	b := newAccount(2, []int{0, 0}, []int{-1, 1}, 1, []demand{waiting(1, 2)})
	share([]*account{a, b}, base, false)
	spread([]*account{a, b}, base)
	// Type 0: 5 spare after a's 2 and b's 1, all to b (it borrows less
	// than a). Type 1: b's limit of 1 takes one, a the other 7.
	if !slices.Equal(b.extra, []int{5, 1}) || !slices.Equal(a.extra, []int{0, 7}) {
		t.Fatalf("spread a %v, b %v; want a [0 7], b [5 1]", a.extra, b.extra)
	}
	// Jobs that cannot run on a type get none of it.
	c := newAccount(2, []int{0, 0}, none(2), 1, []demand{{sf: 1, tp: []float64{1, 0}}})
	share([]*account{c}, base, false)
	spread([]*account{c}, base)
	if c.extra[1] != 0 {
		t.Fatalf("a queue with no job on type 1 got %d of it", c.extra[1])
	}
}

func TestScaleGuarantees(t *testing.T) {
	for _, c := range []struct {
		guar [][]int
		base []int
		want [][]int
		cut  bool
	}{
		{[][]int{{4}, {4}}, []int{8}, [][]int{{4}, {4}}, false},
		{[][]int{{4}, {4}}, []int{6}, [][]int{{3}, {3}}, true},
		{[][]int{{6}, {3}}, []int{4}, [][]int{{3}, {1}}, true},
		// 5/3 and 5/3 and 5/3 of 5: 1 each, the two left by order.
		{[][]int{{3}, {3}, {3}}, []int{5}, [][]int{{2}, {2}, {1}}, true},
	} {
		cut := scaleGuarantees(c.guar, c.base)
		if cut != c.cut || !slices.EqualFunc(c.guar, c.want, slices.Equal[[]int]) {
			t.Fatalf("scaled to %v (cut %v), want %v (%v)", c.guar, cut, c.want, c.cut)
		}
	}
}
