package round

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/policy"
)

// JobView is what a scheduler sees of one active job: estimates, never the
// truth (a live scheduler knows the profile, the declared steps and the
// progress reported so far).
type JobView struct {
	planner.Job
	// Remaining steps: the declared steps minus the steps reported done,
	// always > 0 while the job is active.
	Remaining float64
	// Throughput is the estimated steps/s on each type of View.Types with
	// all workers of one type: consolidated on one server, or spread
	// over servers when the job is wider than any server of the type
	// (that is the speed it would get there); 0 where it cannot run.
	Throughput []float64
	// WidthThroughput is, for an elastic job (Job.Widths set), the
	// estimated steps/s of one unit at each of its widths (row wi for
	// Widths[wi]) on each type of View.Types, as Throughput (planner/speed,
	// "Elastic jobs"): 0 where it cannot run at that width. Nil for a
	// rigid job; the row of its scale factor is Throughput.
	WidthThroughput [][]float64
	// Received is the wall time the job has run on each type, in seconds.
	Received []float64
	// Placement is where the job ran in the last round (or runs now).
	Placement planner.Placement
	// Running is true mid-round for jobs that hold GPUs now.
	Running bool
	// Pinned is true at a round boundary for a running job within its
	// minimum run time: the engine keeps it on Placement whatever the
	// answer, so a scheduler plans the others around it (a plan that
	// gave its GPUs away would be repaired, and the receiver wait).
	Pinned bool
	// Hold is how long a start on new GPUs keeps the job there, in
	// seconds: its minimum run time as the engine holds it (0: none).
	Hold float64
	// Eligible restricts the job to some GPU types of some nodes (Nomad's
	// own placement rules: node pools, constraints, resources, pinned
	// device models); nil allows every node and type. Throughput is 0 for
	// a type no eligible node offers.
	Eligible Eligible
}

// Eligible is where a job may run: for each node, the GPU types allowed
// there; a node absent allows none. A nil Eligible allows everything.
type Eligible map[string]map[planner.GPUType]bool

// Allows reports whether type t on node may run the job.
func (e Eligible) Allows(node string, t planner.GPUType) bool {
	return e == nil || e[node][t]
}

// AllowsUnit reports whether every slot of u is allowed.
func (e Eligible) AllowsUnit(u planner.Unit) bool {
	for _, sl := range u.Slots {
		if !e.Allows(sl.Node, sl.Type) {
			return false
		}
	}
	return true
}

// AnyOf reports whether some node allows type t.
func (e Eligible) AnyOf(t planner.GPUType) bool {
	if e == nil {
		return true
	}
	for _, ts := range e {
		if ts[t] {
			return true
		}
	}
	return false
}

// View is the state a scheduler plans one round (or a mid-round fill) from.
type View struct {
	Now   float64
	Round float64
	// MidRound is true when the scheduler is asked to place waiting jobs on
	// idle GPUs between round boundaries; running jobs must keep theirs.
	MidRound bool
	Types    []planner.GPUType
	Capacity []float64
	Cluster  planner.Cluster
	// Pool holds the GPUs the scheduler may hand out: all of them at a
	// round boundary, only the idle ones mid-round.
	Pool *Pool
	// Jobs are the active jobs in arrival order.
	Jobs []*JobView
	// Reasons, when not nil, has one entry per job of Jobs for the
	// scheduler to explain its decision in its own numbers.
	Reasons []Reason
	// Epoch changes whenever the cluster (nodes, GPUs, drains) changes, so
	// schedulers know when what they derived from it is stale.
	Epoch uint64
}

// Reason is why a scheduler placed a job as it did, in the policy's own
// numbers; fields that do not apply stay zero.
type Reason struct {
	// Share is the fraction of wall time the allocation policy gives the
	// job on each type of View.Types (Gavel's X row).
	Share []float64 `json:"share,omitempty"`
	// Priority is Gavel's round priority: share over time received.
	Priority float64 `json:"priority,omitempty"`
	// Price is what Hadar's prices charge for the job's placement this
	// round; Utility is the value of its progress in that round.
	Price   float64 `json:"price,omitempty"`
	Utility float64 `json:"utility,omitempty"`
	// Timer is how long delay scheduling makes the job wait for a tighter
	// placement; Waited how long it has waited (seconds).
	Timer  float64 `json:"timer_s,omitempty"`
	Waited float64 `json:"waited_s,omitempty"`
	// Why says it in one line for a person.
	Why string `json:"why,omitempty"`
}

// Explain sets the reason of job i when v collects reasons.
func (v *View) Explain(i int, r Reason) {
	if v.Reasons != nil {
		v.Reasons[i] = r
	}
}

// Stateful is a scheduler or placer whose decisions depend on what it
// remembers between rounds. The engine saves that state in its snapshot
// and restores it into a freshly built scheduler of the same name.
type Stateful interface {
	SaveState() ([]byte, error)
	// LoadState replaces the state by a saved one, all or nothing: on an
	// error the receiver is unchanged.
	LoadState(data []byte) error
}

// JobSetKey identifies the set of active jobs of v (in order) on the
// cluster of v.Epoch: schedulers that cache a solve per job set recompute
// when it changes.
func JobSetKey(v *View) string {
	b := make([]byte, 0, 16+len(v.Jobs)*8)
	b = strconv.AppendUint(b, v.Epoch, 10)
	b = append(b, 0)
	for _, j := range v.Jobs {
		b = append(b, j.ID...)
		b = append(b, 0)
	}
	return string(b)
}

// SameCluster reports whether two keys of JobSetKey were taken on the same
// cluster (the same Epoch), whatever their jobs.
func SameCluster(a, b string) bool {
	ea, _, _ := strings.Cut(a, "\x00")
	eb, _, _ := strings.Cut(b, "\x00")
	return ea == eb
}

// PolicyInput is the allocation problem of v's jobs for a policy.
func PolicyInput(v *View, pricePerHour []float64) policy.Input {
	in := policy.Input{Types: v.Types, Capacity: v.Capacity, PricePerHour: pricePerHour, Jobs: make([]policy.JobState, 0, len(v.Jobs))}
	for _, j := range v.Jobs {
		in.Jobs = append(in.Jobs, policy.JobState{
			ID: j.ID, ScaleFactor: j.ScaleFactor, Weight: j.Weight, Throughput: j.Throughput,
			TotalSteps: j.TotalSteps, Remaining: j.Remaining, Age: v.Age(j),
		})
	}
	return in
}

// Scheduler decides placements for one round.
type Scheduler interface {
	Name() string
	// Schedule returns one placement per job of v.Jobs. Mid-round, the
	// placements of running jobs are ignored.
	Schedule(v *View) ([]planner.Placement, error)
}

// Age is the job's time in the system at v.Now.
func (v *View) Age(j *JobView) float64 { return math.Max(0, v.Now-j.Arrival) }

// PolicyScheduler applies an allocation policy through Gavel's round
// mechanism.
type PolicyScheduler struct {
	Policy policy.Policy
	// PricePerHour per type of the view, for the cost policy.
	PricePerHour []float64
	// ResetInterval is the least time between two allocation recomputes
	// (Gavel: 1920 s; 0 = whenever the set of jobs changes). Jobs that
	// arrive in between get no allocation until the next recompute.
	ResetInterval float64
	// Backfill hands GPUs the allocation left idle to jobs that can use
	// them (work conservation).
	Backfill bool
	// Placer places the chosen jobs (nil: previous GPUs, else Pool.Pack).
	Placer Placer
	// Gavel chooses the jobs of each round as Gavel's simulator does
	// (GavelChoice) instead of by the priority pairs of Assign: the
	// round mechanism of the gavel fidelity.
	Gavel bool

	alloc     map[string][]float64
	lastReset float64
	jobSet    string
	started   bool
	types     []planner.GPUType
	// book is Gavel's per-job accounting since the last allocation reset
	// (used when Gavel is set).
	book map[string]*gavelBook
}

// gavelBook is what Gavel's scheduler keeps per job and GPU type between
// two allocation resets (scheduler.py, _reset_time_run_so_far).
type gavelBook struct {
	// AtReset is the job's received time on the type at the last reset.
	AtReset map[planner.GPUType]float64 `json:"at_reset"`
	// Deficit accumulates, at each reset, the time the allocation gave
	// the job on the type minus the time it ran there.
	Deficit map[planner.GPUType]float64 `json:"deficit"`
}

// Name implements Scheduler.
func (s *PolicyScheduler) Name() string { return s.Policy.Name() }

// Schedule implements Scheduler.
func (s *PolicyScheduler) Schedule(v *View) ([]planner.Placement, error) {
	key := JobSetKey(v)
	due := !s.started || v.Now-s.lastReset >= s.ResetInterval-1e-9
	// Rows cached for another set of GPU types cannot be read: recompute
	// whatever the reset interval says.
	stale := !slices.Equal(s.types, v.Types)
	pinned := pins(v)
	key += "\x00" + pinKey(v, pinned)
	if key != s.jobSet && due || stale {
		// The pinned jobs hold their GPUs this round: the others share
		// what is left (pinned.go).
		in, keep := withoutPinned(v, PolicyInput(v, s.PricePerHour), pinned)
		var a policy.Allocation
		if len(in.Jobs) > 0 {
			var err error
			if a, err = s.Policy.Allocate(in); err != nil {
				return nil, fmt.Errorf("round at t=%.0fs: %w", v.Now, err)
			}
		}
		if s.Gavel {
			s.resetBook(v)
		}
		s.alloc = make(map[string][]float64, len(v.Jobs))
		for k, i := range keep {
			s.alloc[v.Jobs[i].ID] = a.X[k]
		}
		for i, jb := range v.Jobs {
			if pinned[i] {
				row := make([]float64, len(v.Types))
				row[pinnedType(v, jb)] = 1
				s.alloc[jb.ID] = row
			}
		}
		s.lastReset, s.jobSet, s.started = v.Now, key, true
		s.types = slices.Clone(v.Types)
	}
	x := make([][]float64, len(v.Jobs))
	inAlloc := make([]bool, len(v.Jobs))
	for i, j := range v.Jobs {
		if row, ok := s.alloc[j.ID]; ok {
			x[i], inAlloc[i] = row, true
		} else {
			x[i] = make([]float64, len(v.Types))
		}
	}
	opt := AssignOptions{Backfill: s.Backfill, Agnostic: isAgnostic(s.Policy), Placer: s.Placer}
	if s.Gavel {
		opt.Gavel = s.gavelChoice(v, inAlloc)
	}
	out := Assign(v, x, opt)
	if v.Reasons != nil {
		explainShares(v, x, out)
	}
	return out, nil
}

func isAgnostic(p policy.Policy) bool {
	switch q := p.(type) {
	case policy.MaxMin:
		return q.Agnostic
	case policy.Makespan:
		return q.Agnostic
	case policy.FinishTimeFairness:
		return q.Agnostic
	}
	return false
}

// AssignOptions tune Assign.
type AssignOptions struct {
	Backfill bool
	// Agnostic backfill ignores throughput when choosing a type.
	Agnostic bool
	// Placer, when set, places the chosen jobs of each type instead of
	// lease extension plus Pool.Pack; with Backfill, GPUs it leaves idle
	// (jobs it delays or evicts) are offered once more to jobs the
	// allocation did not choose.
	Placer Placer
	// Gavel, when set, replaces the choice pass by Gavel's (GavelChoice).
	Gavel *GavelChoice
}

// GavelChoice is the choice pass of Gavel's simulator
// (scheduler.py: _update_priorities, _schedule_jobs_on_workers_helper and
// the placement loop of _schedule_jobs_on_workers), which the gavel
// fidelity reproduces:
//
//   - types are filled one after the other (Gavel: v100, p100, k80; here
//     in Order), each job on at most one type;
//   - on a type, jobs are taken in decreasing priority x / (Round/2 +
//     time run on the type since the last allocation reset), ties broken
//     by larger deficit, then larger share, then arrival; the Round/2 is
//     the half round Gavel credits every job at each reset;
//   - a job with no share on the type (priority 0) still takes GPUs left
//     over once the jobs with a share are placed: Gavel's mechanism is
//     work-conserving for the jobs its allocation knows;
//   - a job that arrived after the last reset is not in the allocation: it
//     is counted against the type's GPUs like the others (priority 0) but
//     never placed, so its GPUs stay idle for the round, as in Gavel;
//   - SkipZero (Gavel's FIFO) never takes a job of priority 0.
type GavelChoice struct {
	// Order lists type indices of the view in the order they are filled.
	Order []int
	// Since[i][j] is the time job i ran on type j since the last reset;
	// Deficit[i][j] Gavel's deficit; InAlloc[i] whether the allocation
	// knows job i.
	Since, Deficit [][]float64
	InAlloc        []bool
	SkipZero       bool
}

// Assign turns time fractions x (one row per v.Jobs) into placements in
// two passes. Choice: (job, type) pairs are taken in decreasing priority
// x_ij / (received_ij / age_i), a never-served pair first, each job on at
// most one type per round, while the type has GPUs left; with Backfill,
// jobs left out then take idle GPUs of the best type with room. Placement:
// per type, jobs keep their previous GPUs when all are still free (lease
// extension, no restart); the others are packed onto as few servers as
// possible, largest scale factor first, which avoids fragmenting servers.
// Mid-round only waiting jobs are placed.
func Assign(v *View, x [][]float64, opt AssignOptions) []planner.Placement {
	out := make([]planner.Placement, len(v.Jobs))
	choice := make([]int, len(v.Jobs)) // chosen type index, -1 = none
	// Pinned jobs first, where they are: nothing else may be chosen onto
	// their GPUs.
	fixed := settlePinned(v, pins(v), out)
	free := make([]int, len(v.Types))
	for j, t := range v.Types {
		free[j] = v.Pool.FreeOfType(t)
	}
	rank := make([]int, len(v.Jobs)) // order in which jobs were chosen
	next := 0
	if opt.Gavel != nil {
		gavelChoose(v, x, opt.Gavel, fixed, choice, free, rank)
	} else {
		next = chooseByPriority(v, x, fixed, choice, free, rank)
	}
	if opt.Backfill {
		backfill(v, fixed, choice, free, rank, &next, opt.Agnostic)
	}
	return place(v, opt, fixed, choice, free, rank, next, out)
}

// chooseByPriority is Assign's choice pass: (job, type) pairs in decreasing
// priority x_ij / (received_ij / age_i), a job on at most one type, while
// the type has GPUs left. Types identical for every job count as one
// (typeClasses): shares and time received on them are summed, and a job
// chosen for them stays on the one it runs on when it has room. It
// returns how many jobs it chose.
func chooseByPriority(v *View, x [][]float64, fixed []bool, choice, free, rank []int) int {
	type pair struct {
		i, j int
		prio float64
	}
	class := typeClasses(v)
	var pairs []pair
	// owed[i][c] is the time job i is owed on class c: its share of the
	// job's age less the time it ran there.
	owed := make([][]float64, len(v.Jobs))
	for i, jb := range v.Jobs {
		choice[i] = -1
		if fixed[i] {
			continue
		}
		age := math.Max(v.Age(jb), 1e-9)
		xc := make([]float64, len(v.Types))
		rc := make([]float64, len(v.Types))
		for j, xij := range x[i] {
			xc[class[j]] += xij
			rc[class[j]] += jb.Received[j]
		}
		owed[i] = make([]float64, len(v.Types))
		for c := range xc {
			owed[i][c] = xc[c]*age - rc[c]
		}
		for j, xij := range xc {
			if class[j] != j || xij <= 1e-9 {
				continue
			}
			share := rc[j] / age
			prio := math.Inf(1)
			if share > 0 {
				prio = xij / share
			}
			pairs = append(pairs, pair{i, j, prio})
		}
	}
	slices.SortFunc(pairs, func(pa, pb pair) int {
		if pa.prio != pb.prio {
			return cmp.Compare(pb.prio, pa.prio)
		}
		// Among never-served pairs, the larger share goes first.
		if xa, xb := x[pa.i][pa.j], x[pb.i][pb.j]; xa != xb {
			return cmp.Compare(xb, xa)
		}
		return cmp.Or(cmp.Compare(pa.i, pb.i), cmp.Compare(pa.j, pb.j))
	})
	next := 0
	for _, p := range pairs {
		sf := v.Jobs[p.i].ScaleFactor
		if choice[p.i] >= 0 {
			continue
		}
		t := -1
		if cur := pinnedType(v, v.Jobs[p.i]); cur >= 0 && class[cur] != p.j && owed[p.i][p.j] < moveOwed(v, v.Jobs[p.i]) {
			// A move holds the job on the new type for its minimum run
			// time, where Gavel's priorities assume a round, and the
			// allocation, solved again around each round's pins, may
			// give it no share where it runs only because others hold
			// those GPUs now: owed less than a round there, it stays
			// where it runs when there is room.
			t = pickInClass(v, class, p.i, class[cur], free)
		}
		if t < 0 {
			t = pickInClass(v, class, p.i, p.j, free)
		}
		if t < 0 {
			continue
		}
		choice[p.i], free[t] = t, free[t]-sf
		rank[p.i], next = next, next+1
	}
	stayInClass(v, class, choice, free)
	return next
}

// moveOwed is the least time a running job must be owed on another type
// for the choice pass to move it there: a round (the unit Gavel's
// priorities count in), or its minimum run time when shorter; no bound for
// a job without one, which the next round may move back.
func moveOwed(v *View, jb *JobView) float64 {
	if jb.Hold <= 0 {
		return math.Inf(-1)
	}
	return math.Min(jb.Hold, v.Round)
}

// pickInClass is the type of class c job i is chosen for: the one it
// runs on when it has room, else the one with the most room; -1 if none
// has room for it.
func pickInClass(v *View, class []int, i, c int, free []int) int {
	jb := v.Jobs[i]
	if prev := pinnedType(v, jb); prev >= 0 && class[prev] == c && free[prev] >= jb.ScaleFactor {
		return prev
	}
	best := -1
	for k := range v.Types {
		if class[k] == c && free[k] >= jb.ScaleFactor && (best < 0 || free[k] > free[best]) {
			best = k
		}
	}
	return best
}

// stayInClass puts a chosen job that was given another type of the class
// it runs on back on its own type where room is left now (a job chosen
// later took another type's GPUs): no move between identical types.
func stayInClass(v *View, class, choice, free []int) {
	for i, t := range choice {
		if t < 0 {
			continue
		}
		sf := v.Jobs[i].ScaleFactor
		if prev := pinnedType(v, v.Jobs[i]); prev >= 0 && prev != t && class[prev] == class[t] && free[prev] >= sf {
			choice[i], free[t], free[prev] = prev, free[t]+sf, free[prev]-sf
		}
	}
}

// place puts the chosen jobs on GPUs, per type: through opt.Placer, or by
// lease extension and Pool.Pack.
func place(v *View, opt AssignOptions, fixed []bool, choice, free, rank []int, next int, out []planner.Placement) []planner.Placement {
	if opt.Placer != nil {
		placeWith(v, opt.Placer, choice, rank, out)
		if opt.Backfill {
			// GPUs held back by delayed or evicted jobs go to jobs the
			// allocation left out, placed by the same Placer.
			for j, t := range v.Types {
				free[j] = v.Pool.FreeOfType(t)
			}
			second := slices.Clone(choice)
			backfill(v, fixed, second, free, rank, &next, opt.Agnostic)
			for i := range second {
				if choice[i] >= 0 {
					second[i] = -1 // already placed or held back
				}
			}
			placeWith(v, opt.Placer, second, rank, out)
		}
		return out
	}
	// Placement, per type.
	for j, t := range v.Types {
		var chosen []int
		for i, c := range choice {
			if c == j {
				chosen = append(chosen, i)
			}
		}
		// Lease extension: consolidated jobs first; a job spread over
		// several servers keeps its GPUs only when no placement on fewer
		// servers is free, so a lease never locks in a slow spread
		// placement.
		var rest, spread []int
		tryKeep := func(i int) {
			if u, ok := keep(v.Pool, v.Jobs[i], t); ok {
				out[i] = planner.Placement{Units: []planner.Unit{u}}
			} else {
				rest = append(rest, i)
			}
		}
		for _, i := range chosen {
			if prev := v.Jobs[i].Placement.Units; len(prev) == 1 && prev[0].Nodes() > 1 {
				spread = append(spread, i)
			} else {
				tryKeep(i)
			}
		}
		for _, i := range spread {
			undo := v.Pool.Restrict(v.Jobs[i].Eligible)
			u, ok := v.Pool.Pack(t, v.Jobs[i].ScaleFactor)
			undo()
			if ok && u.Nodes() < v.Jobs[i].Placement.Units[0].Nodes() {
				rest = append(rest, i)
			} else {
				tryKeep(i)
			}
		}
		sort.SliceStable(rest, func(a, b int) bool {
			sa, sb := v.Jobs[rest[a]].ScaleFactor, v.Jobs[rest[b]].ScaleFactor
			if sa != sb {
				return sa > sb
			}
			return rank[rest[a]] < rank[rest[b]]
		})
		for _, i := range rest {
			undo := v.Pool.Restrict(v.Jobs[i].Eligible)
			u, ok := v.Pool.Pack(t, v.Jobs[i].ScaleFactor)
			undo()
			if ok {
				v.Pool.Take(u)
				out[i] = planner.Placement{Units: []planner.Unit{u}}
			}
		}
	}
	return out
}

// placeWith hands each type's chosen jobs (choice[i] is the type index, -1
// none) to the placer, largest scale factor first, then by rank.
func placeWith(v *View, pl Placer, choice, rank []int, out []planner.Placement) {
	for j, t := range v.Types {
		var jobs []int
		for i, c := range choice {
			if c == j {
				jobs = append(jobs, i)
			}
		}
		if len(jobs) == 0 {
			continue
		}
		sort.SliceStable(jobs, func(a, b int) bool {
			sa, sb := v.Jobs[jobs[a]].ScaleFactor, v.Jobs[jobs[b]].ScaleFactor
			if sa != sb {
				return sa > sb
			}
			return rank[jobs[a]] < rank[jobs[b]]
		})
		units := pl.Place(v, t, jobs)
		for k, i := range jobs {
			if k < len(units) && len(units[k].Slots) > 0 {
				out[i] = planner.Placement{Units: []planner.Unit{units[k]}}
			}
		}
	}
}

// backfill gives the GPUs the allocation left idle to jobs it did not
// choose, least served first, on the best type with room (the type with the
// most room when agnostic).
func backfill(v *View, fixed []bool, choice, free, rank []int, next *int, agnostic bool) {
	var rest []int
	for i := range v.Jobs {
		if choice[i] < 0 && !fixed[i] {
			rest = append(rest, i)
		}
	}
	class := typeClasses(v)
	served := make([]float64, len(v.Jobs))
	for _, i := range rest {
		s := 0.0
		for _, r := range v.Jobs[i].Received {
			s += r
		}
		served[i] = s / math.Max(v.Age(v.Jobs[i]), 1e-9)
	}
	slices.SortFunc(rest, func(a, b int) int { return cmp.Or(cmp.Compare(served[a], served[b]), cmp.Compare(a, b)) })
	for _, i := range rest {
		jb := v.Jobs[i]
		best, prev := -1, pinnedType(v, jb)
		for j, tp := range jb.Throughput {
			if tp <= 0 || free[j] < jb.ScaleFactor {
				continue
			}
			var better bool
			switch {
			case best < 0:
				better = true
			case class[j] == class[best] && (j == prev) != (best == prev):
				// Identical types: stay on the one it runs on.
				better = j == prev
			case agnostic:
				better = free[j] > free[best]
			default:
				better = tp > jb.Throughput[best]
			}
			if better {
				best = j
			}
		}
		if best >= 0 {
			choice[i], free[best] = best, free[best]-jb.ScaleFactor
			rank[i], *next = *next, *next+1
		}
	}
}

// keep takes the job's previous GPUs if they are all of type t and free.
func keep(pool *Pool, jb *JobView, t planner.GPUType) (planner.Unit, bool) {
	prev := jb.Placement.Units
	if len(prev) != 1 || prev[0].GPUs() != jb.ScaleFactor {
		return planner.Unit{}, false
	}
	for _, s := range prev[0].Slots {
		if s.Type != t {
			return planner.Unit{}, false
		}
	}
	if !jb.Eligible.AllowsUnit(prev[0]) || !pool.Fits(prev[0]) {
		return planner.Unit{}, false
	}
	pool.Take(prev[0])
	return prev[0], true
}

// gavelChoose is the choice pass of GavelChoice.
func gavelChoose(v *View, x [][]float64, g *GavelChoice, fixed []bool, choice, free, rank []int) {
	type entry struct {
		i             int
		prio, deficit float64
	}
	for i := range choice {
		choice[i] = -1
	}
	chosen := make([]bool, len(v.Jobs))
	next := 0
	half := v.Round / 2
	for _, j := range g.Order {
		var entries []entry
		for i, jb := range v.Jobs {
			if fixed[i] || jb.Throughput[j] <= 0 {
				continue
			}
			e := entry{i: i, deficit: g.Deficit[i][j]}
			if g.InAlloc[i] && x[i][j] > 0 {
				e.prio = x[i][j] / (half + g.Since[i][j])
			}
			entries = append(entries, e)
		}
		slices.SortStableFunc(entries, func(a, b entry) int {
			return cmp.Or(cmp.Compare(b.prio, a.prio), cmp.Compare(b.deficit, a.deficit), cmp.Compare(x[b.i][j], x[a.i][j]))
		})
		for _, e := range entries {
			sf := v.Jobs[e.i].ScaleFactor
			if free[j] == 0 {
				break
			}
			if chosen[e.i] || g.SkipZero && e.prio <= 0 || sf > free[j] {
				continue
			}
			chosen[e.i], free[j] = true, free[j]-sf
			if g.InAlloc[e.i] {
				choice[e.i], rank[e.i], next = j, next, next+1
			}
		}
	}
}

// resetBook is Gavel's _reset_time_run_so_far, at an allocation reset
// (before the new allocation replaces the old one): every active job's
// deficit on each type grows by the time the old allocation gave it there
// minus the time it ran there since the last reset, and the time run since
// the reset starts again from zero.
func (s *PolicyScheduler) resetBook(v *View) {
	elapsed := 0.0
	if s.started {
		elapsed = v.Now - s.lastReset
	}
	book := make(map[string]*gavelBook, len(v.Jobs))
	for _, jb := range v.Jobs {
		b := s.book[jb.ID]
		if b == nil {
			b = &gavelBook{AtReset: map[planner.GPUType]float64{}, Deficit: map[planner.GPUType]float64{}}
		}
		old := s.alloc[jb.ID]
		for j, t := range v.Types {
			share := 0.0
			if k := slices.Index(s.types, t); k >= 0 && k < len(old) {
				share = old[k]
			}
			if d := share*elapsed - (jb.Received[j] - b.AtReset[t]); d != 0 {
				b.Deficit[t] += d
			}
			b.AtReset[t] = jb.Received[j]
		}
		book[jb.ID] = b
	}
	s.book = book
}

// gavelChoice builds the GavelChoice of v from the book: types are filled
// fastest first (Gavel's fixed v100, p100, k80), the speed of a type being
// the mean over the active jobs of their throughput there relative to
// their best type.
func (s *PolicyScheduler) gavelChoice(v *View, inAlloc []bool) *GavelChoice {
	g := &GavelChoice{InAlloc: inAlloc, Since: make([][]float64, len(v.Jobs)), Deficit: make([][]float64, len(v.Jobs))}
	_, g.SkipZero = s.Policy.(policy.FIFO)
	speed := make([]float64, len(v.Types))
	for i, jb := range v.Jobs {
		best := 0.0
		for _, tp := range jb.Throughput {
			best = math.Max(best, tp)
		}
		g.Since[i] = make([]float64, len(v.Types))
		g.Deficit[i] = make([]float64, len(v.Types))
		b := s.book[jb.ID]
		for j, t := range v.Types {
			if best > 0 {
				speed[j] += jb.Throughput[j] / best
			}
			if b != nil {
				g.Since[i][j] = jb.Received[j] - b.AtReset[t]
				g.Deficit[i][j] = b.Deficit[t]
			}
		}
	}
	g.Order = make([]int, len(v.Types))
	for j := range g.Order {
		g.Order[j] = j
	}
	slices.SortStableFunc(g.Order, func(a, b int) int { return cmp.Compare(speed[b], speed[a]) })
	return g
}
