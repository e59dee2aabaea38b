package netmodel

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// gridSpec is racks x nodesPerRack nodes of gpus GPUs each, all of one
// type, with the given intra-node and NIC speeds in Gbit/s.
func gridSpec(racks, nodesPerRack, gpus int, intraGbps, nicGbps float64) Spec {
	s := Spec{
		IntraNode:  LinkSpec{Gbps: intraGbps, LatencyUS: 5},
		NodeUplink: LinkSpec{Gbps: nicGbps, LatencyUS: 10},
		RackUplink: RackUplinkSpec{LatencyUS: 20},
		Spine:      LinkSpec{LatencyUS: 5},
	}
	for r := 0; r < racks; r++ {
		s.Racks = append(s.Racks, RackSpec{Name: fmt.Sprintf("r%d", r)})
		for n := 0; n < nodesPerRack; n++ {
			s.Nodes = append(s.Nodes, NodeSpec{ID: fmt.Sprintf("n%d-%d", r, n), Rack: fmt.Sprintf("r%d", r), GPUType: "v100", GPUs: gpus})
		}
	}
	return s
}

func mustTopology(t testing.TB, s Spec) *Topology {
	t.Helper()
	tp, err := NewTopology(s)
	if err != nil {
		t.Fatal(err)
	}
	return tp
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }

func TestRingTime(t *testing.T) {
	for _, tc := range []struct {
		n              int
		bytes, bw, lat float64
		want           float64
	}{
		{1, 100, 10, 1, 0},
		{2, 100, 10, 0.5, 100.0/10 + 2*0.5},
		{4, 100, 10, 0, 1.5 * 100 / 10},
		{8, 80, 1, 0.25, 1.75*80 + 14*0.25},
	} {
		if got := ringTime(tc.n, tc.bytes, tc.bw, tc.lat); !near(got, tc.want) {
			t.Errorf("ringTime(%d, %g, %g, %g) = %g, want %g", tc.n, tc.bytes, tc.bw, tc.lat, got, tc.want)
		}
	}
}

func TestPrice(t *testing.T) {
	// 2 racks x 2 nodes x 4 GPUs; intra 80 Gbit/s = 10 GB/s, NIC 8 Gbit/s =
	// 1 GB/s, rack uplinks 2:1 oversubscribed = 1 GB/s, spine non-blocking.
	s := gridSpec(2, 2, 4, 80, 8)
	s.RackUplink.Oversubscription = 2
	tp := mustTopology(t, s)
	const bytes = 1e8
	job := &JobComm{Name: "j", Bytes: bytes, Compute: map[string]float64{"v100": 0.2}, Overlap: 0.25}
	const intraLat, hopNode, hopRack = 5e-6, 20e-6, 20e-6 + 40e-6 + 5e-6
	cases := []struct {
		name     string
		p        Placement
		loc      Locality
		wantComm float64
		wantRef  float64
	}{
		{"one GPU", Placement{{"n0-0", 0}}, SameNode, 0, 0},
		{"two GPUs one node", Placement{{"n0-0", 0}, {"n0-0", 1}}, SameNode, bytes/1e10 + 2*intraLat, bytes/1e10 + 2*intraLat},
		{"two nodes one rack", Placement{{"n0-0", 0}, {"n0-1", 0}}, SameRack, bytes/1e9 + 2*hopNode, bytes/1e10 + 2*intraLat},
		{"two racks", Placement{{"n0-0", 0}, {"n1-0", 3}}, CrossRack, bytes/1e9 + 2*hopRack, bytes/1e10 + 2*intraLat},
		{"eight GPUs two nodes", Placement{{"n0-0", 0}, {"n0-0", 1}, {"n0-0", 2}, {"n0-0", 3}, {"n0-1", 0}, {"n0-1", 1}, {"n0-1", 2}, {"n0-1", 3}},
			SameRack, 1.75*bytes/1e9 + 14*hopNode, 1.75*bytes/1e9 + 14*hopNode},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pr, err := tp.Price(job, tc.p, 0)
			if err != nil {
				t.Fatal(err)
			}
			if pr.Locality != tc.loc {
				t.Errorf("locality %v, want %v", pr.Locality, tc.loc)
			}
			if !near(pr.Comm, tc.wantComm) {
				t.Errorf("comm %g, want %g", pr.Comm, tc.wantComm)
			}
			wantIter := iteration(0.2, tc.wantComm, 0.25)
			if !near(pr.Iteration, wantIter) {
				t.Errorf("iteration %g, want %g", pr.Iteration, wantIter)
			}
			if want := iteration(0.2, tc.wantRef, 0.25); !near(pr.Reference, want) {
				t.Errorf("reference %g, want %g", pr.Reference, want)
			}
			if want := max(1, wantIter/pr.Reference); !near(pr.Slowdown, want) {
				t.Errorf("slowdown %g, want %g", pr.Slowdown, want)
			}
			if want := float64(len(tc.p)) / wantIter; !near(pr.Throughput, want) {
				t.Errorf("throughput %g, want %g", pr.Throughput, want)
			}
		})
	}

	// Congestion: half the spine and 80 % of rack r1's uplink taken; the
	// cross-rack ring is then limited by r1's uplink at 0.2 GB/s.
	ctp, err := tp.WithCongestion(Congestion{Spine: 0.5, Racks: map[string]float64{"r1": 0.8}})
	if err != nil {
		t.Fatal(err)
	}
	comm, err := ctp.CommTime(job, cases[3].p, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if want := bytes/2e8 + 2*hopRack; !near(comm, want) {
		t.Errorf("congested cross-rack comm %g, want %g", comm, want)
	}
	// Same-rack traffic in r0 never touches r1's uplink or the spine.
	comm, err = ctp.CommTime(job, cases[2].p, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if want := bytes/1e9 + 2*hopNode; !near(comm, want) {
		t.Errorf("congested same-rack comm %g, want %g", comm, want)
	}
}

func TestIterationOverlap(t *testing.T) {
	for _, tc := range []struct{ compute, comm, h, want float64 }{
		{1, 0.5, 0, 1.5},
		{1, 0.5, 0.5, 1},   // exactly hidden
		{1, 0.5, 0.9, 1},   // hidden with room to spare
		{1, 2, 0.5, 2.5},   // 0.5 hidden, 1.5 exposed
		{0.1, 0, 0.3, 0.1}, // no communication
	} {
		if got := iteration(tc.compute, tc.comm, tc.h); !near(got, tc.want) {
			t.Errorf("iteration(%g, %g, %g) = %g, want %g", tc.compute, tc.comm, tc.h, got, tc.want)
		}
		// invertIteration must undo iteration wherever compute dominates.
		if got := invertIteration(tc.want, tc.comm, tc.h); tc.want > tc.comm && !near(got, tc.compute) {
			t.Errorf("invertIteration(%g, %g, %g) = %g, want %g", tc.want, tc.comm, tc.h, got, tc.compute)
		}
	}
}

func randomJob(rng *rand.Rand) *JobComm {
	return &JobComm{
		Name:    "rand",
		Bytes:   math.Exp(math.Log(1e5) + rng.Float64()*math.Log(1e4)), // 100 KB .. 1 GB
		Compute: map[string]float64{"v100": 1e-3 * math.Exp(rng.Float64()*math.Log(1e3))},
		Overlap: rng.Float64() * 0.95,
	}
}

// randomPlacement picks n distinct GPUs uniformly from tp.
func randomPlacement(rng *rand.Rand, tp *Topology, n int) Placement {
	var all Placement
	for _, nd := range tp.nodes {
		for g := 0; g < nd.gpus; g++ {
			all = append(all, Worker{nd.id, g})
		}
	}
	rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	return all[:n]
}

// biasedPlacement fills whole nodes or racks first with some probability,
// so that the property tests see packed placements as often as spread ones.
func biasedPlacement(rng *rand.Rand, tp *Topology, n int) Placement {
	if rng.IntN(2) == 0 {
		return randomPlacement(rng, tp, n)
	}
	var p Placement
	start := rng.IntN(len(tp.nodes))
	for i := 0; len(p) < n; i++ {
		nd := tp.nodes[(start+i)%len(tp.nodes)]
		for g := 0; g < nd.gpus && len(p) < n; g++ {
			p = append(p, Worker{nd.id, g})
		}
	}
	return p
}

func spreadOf(tp *Topology, p Placement) (nodes, racks int) {
	ns, rs := map[int]bool{}, map[int]bool{}
	for _, w := range p {
		ni := tp.byID[w.Node]
		ns[ni], rs[tp.nodes[ni].rack] = true, true
	}
	return len(ns), len(rs)
}

// On a homogeneous fabric, a placement that spans at least as many nodes
// and racks as another is never faster, and never faster than consolidated.
func TestMonotoneInSpread(t *testing.T) {
	s := gridSpec(4, 4, 4, 200, 10)
	s.RackUplink.Oversubscription = 2
	tp := mustTopology(t, s)
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 3000; trial++ {
		job := randomJob(rng)
		n := 2 + rng.IntN(62) // past the 32-worker stack buffer too
		p1, p2 := biasedPlacement(rng, tp, n), biasedPlacement(rng, tp, n)
		n1, r1 := spreadOf(tp, p1)
		n2, r2 := spreadOf(tp, p2)
		if n2 < n1 || r2 < r1 {
			p1, p2, n1, n2, r1, r2 = p2, p1, n2, n1, r2, r1
		}
		a, err := tp.Price(job, p1, 0)
		if err != nil {
			t.Fatal(err)
		}
		b, err := tp.Price(job, p2, 0)
		if err != nil {
			t.Fatal(err)
		}
		if a.Slowdown < 1 || b.Slowdown < 1 || a.Iteration < a.Reference*(1-1e-12) {
			t.Fatalf("trial %d: slowdown below 1: %+v %+v", trial, a, b)
		}
		if n2 >= n1 && r2 >= r1 && b.Iteration < a.Iteration*(1-1e-12) {
			t.Fatalf("trial %d: %d nodes/%d racks took %g s, %d nodes/%d racks took %g s", trial, n2, r2, b.Iteration, n1, r1, a.Iteration)
		}
		if b.Locality >= a.Locality && r2 >= r1 && b.Iteration < a.Iteration*(1-1e-12) {
			t.Fatalf("trial %d: %v faster than %v", trial, b.Locality, a.Locality)
		}
	}
}

// On any fabric, more background load on any link never makes a placement
// faster.
func TestMonotoneInCongestion(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 300; trial++ {
		s := gridSpec(1+rng.IntN(4), 1+rng.IntN(4), 1+rng.IntN(8), 50+rng.Float64()*500, 1+rng.Float64()*100)
		for i := range s.Nodes {
			s.Nodes[i].NICGbps = 1 + rng.Float64()*100
		}
		for i := range s.Racks {
			s.Racks[i].Oversubscription = 1 + rng.Float64()*8
		}
		s.Spine.Gbps = rng.Float64() * 400
		tp := mustTopology(t, s)
		total := 0
		for _, nd := range tp.nodes {
			total += nd.gpus
		}
		rackNames := tp.RackNames()
		for k := 0; k < 10; k++ {
			job := randomJob(rng)
			p := biasedPlacement(rng, tp, 1+rng.IntN(total))
			lo := Congestion{Spine: rng.Float64() * 0.9, Node: rng.Float64() * 0.9, Racks: map[string]float64{}}
			hi := Congestion{Spine: lo.Spine + rng.Float64()*(0.99-lo.Spine), Node: lo.Node + rng.Float64()*(0.99-lo.Node), Racks: map[string]float64{}}
			for _, r := range rackNames {
				lo.Racks[r] = rng.Float64() * 0.9
				hi.Racks[r] = lo.Racks[r] + rng.Float64()*(0.99-lo.Racks[r])
			}
			var iters [3]float64
			for i, c := range []*Congestion{nil, &lo, &hi} {
				ctp := tp
				if c != nil {
					var err error
					if ctp, err = tp.WithCongestion(*c); err != nil {
						t.Fatal(err)
					}
				}
				pr, err := ctp.Price(job, p, 0)
				if err != nil {
					t.Fatal(err)
				}
				if pr.Slowdown < 1 || math.IsNaN(pr.Iteration) || math.IsInf(pr.Iteration, 0) {
					t.Fatalf("trial %d: bad price %+v", trial, pr)
				}
				iters[i] = pr.Iteration
			}
			if iters[1] < iters[0]*(1-1e-12) || iters[2] < iters[1]*(1-1e-12) {
				t.Fatalf("trial %d: iteration none/low/high congestion = %v, want non-decreasing", trial, iters)
			}
		}
	}
}

func TestMonotoneInBytes(t *testing.T) {
	tp := mustTopology(t, gridSpec(2, 2, 4, 200, 10))
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 500; trial++ {
		job := randomJob(rng)
		p := biasedPlacement(rng, tp, 1+rng.IntN(16))
		a, err := tp.IterationTime(job, p, 0)
		if err != nil {
			t.Fatal(err)
		}
		bigger := *job
		bigger.Bytes *= 1 + rng.Float64()
		less := *job
		less.Overlap *= rng.Float64()
		for _, j := range []*JobComm{&bigger, &less} {
			b, err := tp.IterationTime(j, p, 0)
			if err != nil {
				t.Fatal(err)
			}
			if b < a*(1-1e-12) {
				t.Fatalf("trial %d: more bytes or less overlap made it faster: %g < %g", trial, b, a)
			}
		}
	}
}

func TestTimeVaryingCongestion(t *testing.T) {
	s := gridSpec(2, 2, 4, 200, 10)
	s.Congestion = []CongestionSpec{
		{At: "1h", Spine: 0.6},
		{At: "2h", RackUplink: 0.5, Racks: map[string]float64{"r1": 0.9}},
		{At: "3h"},
	}
	tp := mustTopology(t, s)
	job := &JobComm{Bytes: 1e8, Compute: map[string]float64{"v100": 0.05}}
	cross := Placement{{"n0-0", 0}, {"n1-0", 0}}
	local := Placement{{"n0-0", 0}, {"n0-1", 0}}
	at := func(p Placement, d time.Duration) float64 {
		v, err := tp.IterationTime(job, p, d)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	base := at(cross, 0)
	if at(cross, 59*time.Minute) != base || at(cross, 3*time.Hour) != base || at(cross, 100*time.Hour) != base {
		t.Error("outside the congested windows the cross-rack time must equal the uncongested one")
	}
	if !(at(cross, time.Hour) > base && at(cross, 2*time.Hour+time.Minute) > at(cross, time.Hour+30*time.Minute)) {
		t.Error("cross-rack time must rise at 1h and rise further at 2h")
	}
	if at(local, 2*time.Hour) != at(local, 0) {
		t.Error("same-rack traffic must not see spine or rack-uplink congestion")
	}
	c := tp.CongestionAt(2*time.Hour + time.Second)
	if c.Spine != 0 || c.Racks["r0"] != 0.5 || c.Racks["r1"] != 0.9 {
		t.Errorf("CongestionAt(2h) = %+v; entries must not inherit earlier fields", c)
	}
}

func TestPriceErrors(t *testing.T) {
	tp := mustTopology(t, gridSpec(1, 2, 2, 100, 10))
	job := &JobComm{Name: "j", Bytes: 1, Compute: map[string]float64{"v100": 1}}
	for _, tc := range []struct {
		name string
		job  *JobComm
		p    Placement
		want string
	}{
		{"empty", job, nil, "placement: want at least one worker"},
		{"unknown node", job, Placement{{"nope", 0}}, `placement[0].node: "nope" is not in the topology`},
		{"gpu out of range", job, Placement{{"n0-0", 0}, {"n0-1", 2}}, `placement[1].gpu: node "n0-1" has GPUs 0..1, got 2`},
		{"duplicate", job, Placement{{"n0-0", 1}, {"n0-1", 0}, {"n0-0", 1}}, `GPU 1 of node "n0-0" is listed twice`},
		{"no compute for type", &JobComm{Name: "k", Bytes: 1, Compute: map[string]float64{"k80": 1}}, Placement{{"n0-0", 0}}, `job "k": compute["v100"]`},
		{"bad overlap", &JobComm{Name: "o", Bytes: 1, Overlap: 1, Compute: job.Compute}, Placement{{"n0-0", 0}}, "overlap: want a fraction in [0, 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tp.Price(tc.job, tc.p, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestLocality(t *testing.T) {
	tp := mustTopology(t, gridSpec(2, 2, 2, 100, 10))
	for _, tc := range []struct {
		p    Placement
		want Locality
	}{
		{Placement{{"n0-0", 0}}, SameNode},
		{Placement{{"n0-0", 0}, {"n0-0", 1}}, SameNode},
		{Placement{{"n0-0", 0}, {"n0-1", 1}}, SameRack},
		{Placement{{"n0-0", 0}, {"n0-1", 1}, {"n1-1", 0}}, CrossRack},
	} {
		got, err := tp.Locality(tc.p)
		if err != nil || got != tc.want {
			t.Errorf("Locality(%v) = %v, %v; want %v", tc.p, got, err, tc.want)
		}
		pr, err := tp.Price(&JobComm{Bytes: 1, Compute: map[string]float64{"v100": 1}}, tc.p, 0)
		if err != nil || pr.Locality != tc.want {
			t.Errorf("Price(%v).Locality = %v, %v; want %v", tc.p, pr.Locality, err, tc.want)
		}
	}
	if _, err := tp.Locality(Placement{{"n0-0", 0}, {"x", 0}}); err == nil {
		t.Error("unknown node: want an error")
	}
}

func TestSensitivityMatchesPlacements(t *testing.T) {
	tp := mustTopology(t, gridSpec(4, 4, 4, 200, 10))
	job := &JobComm{Name: "s", Bytes: 2e8, Compute: map[string]float64{"v100": 0.1}, Overlap: 0.3}
	for _, n := range []int{1, 2, 4, 8} {
		sens, err := tp.Sensitivity(job, "v100", n)
		if err != nil {
			t.Fatal(err)
		}
		var rackSpread, crossSpread Placement
		for i := 0; i < n; i++ {
			rackSpread = append(rackSpread, Worker{fmt.Sprintf("n0-%d", i%4), i / 4})
			crossSpread = append(crossSpread, Worker{fmt.Sprintf("n%d-%d", i%4, i/4), 0})
		}
		if n <= 4 {
			got, err := tp.IterationTime(job, rackSpread, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !near(got, sens.SameRack) {
				t.Errorf("n=%d: SameRack %g, placement says %g", n, sens.SameRack, got)
			}
		}
		pr, err := tp.Price(job, crossSpread, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !near(pr.Iteration, sens.CrossRack) || !near(pr.Reference, sens.Consolidated) {
			t.Errorf("n=%d: sensitivity %+v, cross-rack placement %+v", n, sens, pr)
		}
		if sens.RackSlowdown < 1 || sens.SpineSlowdown < sens.RackSlowdown || (n == 1 && sens.SpineSlowdown != 1) {
			t.Errorf("n=%d: slowdowns %+v must satisfy 1 <= rack <= spine, and be 1 for one worker", n, sens)
		}
	}
	if _, err := tp.Sensitivity(job, "h100", 2); err == nil || !strings.Contains(err.Error(), `gpu type "h100"`) {
		t.Errorf("unknown type: error %v", err)
	}
}

func TestComputeTimeRoundTrip(t *testing.T) {
	tp := mustTopology(t, gridSpec(2, 2, 4, 200, 10))
	for _, sf := range []int{1, 2, 4, 8} {
		for _, h := range []float64{0, 0.4, 0.9} {
			const thr = 40.0 // steps/s aggregate
			c, err := tp.ComputeTime("v100", sf, thr, 5e7, h)
			if err != nil {
				t.Fatal(err)
			}
			job := &JobComm{Bytes: 5e7, Overlap: h, Compute: map[string]float64{"v100": c}}
			var p Placement
			for i := 0; i < sf; i++ {
				p = append(p, Worker{fmt.Sprintf("n0-%d", i/4), i % 4})
			}
			pr, err := tp.Price(job, p, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !near(pr.Throughput, thr) || !near(pr.Iteration, pr.Reference) {
				t.Errorf("sf=%d h=%g: consolidated throughput %g, want %g (reference %g, iteration %g)", sf, h, pr.Throughput, thr, pr.Reference, pr.Iteration)
			}
		}
	}
	if _, err := tp.ComputeTime("v100", 2, 0, 1, 0); err == nil {
		t.Error("zero throughput: want an error")
	}
	j, err := tp.JobFromThroughput("m", 1e6, 0.2, 2, map[string]float64{"v100": 10, "k80": 0})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := j.Compute["k80"]; ok || j.Compute["v100"] <= 0 {
		t.Errorf("JobFromThroughput: compute %v; want v100 only (k80 throughput 0 means cannot run)", j.Compute)
	}
}

// Each rack boundary of the ring is one flow through the spine, so a ring
// over r racks gets spine/r per flow.
func TestSpineSharedByRackCrossings(t *testing.T) {
	s := gridSpec(4, 1, 1, 100, 80) // NIC 10 GB/s: never the bottleneck here
	s.Spine.Gbps = 96               // 12 GB/s
	tp := mustTopology(t, s)
	job := &JobComm{Bytes: 1.2e9, Compute: map[string]float64{"v100": 1}}
	const hop = 20e-6 + 40e-6 + 5e-6
	for _, tc := range []struct {
		racks   int
		spineBW float64
	}{{2, 6e9}, {3, 4e9}, {4, 3e9}} {
		var p Placement
		for r := 0; r < tc.racks; r++ {
			p = append(p, Worker{fmt.Sprintf("n%d-0", r), 0})
		}
		got, err := tp.CommTime(job, p, 0)
		if err != nil {
			t.Fatal(err)
		}
		n := float64(tc.racks)
		if want := 2*(n-1)/n*job.Bytes/tc.spineBW + 2*(n-1)*hop; !near(got, want) {
			t.Errorf("%d racks: comm %g, want %g", tc.racks, got, want)
		}
	}
}

func TestLinkLoad(t *testing.T) {
	// 2 racks x 2 nodes, NIC 8 Gbit/s = 1 GB/s, rack uplinks 1 GB/s,
	// spine 12 Gbit/s = 1.5 GB/s.
	s := gridSpec(2, 2, 4, 800, 8)
	s.RackUplink.Oversubscription = 2
	s.Spine.Gbps = 12
	tp := mustTopology(t, s)
	job := &JobComm{Name: "j", Bytes: 1e9, Compute: map[string]float64{"v100": 1}}
	const hopNode, hopRack = 20e-6, 20e-6 + 40e-6 + 5e-6
	cross := Placement{{"n0-0", 0}, {"n1-0", 0}}
	other := Placement{{"n0-1", 0}, {"n1-1", 0}}
	local := Placement{{"n0-0", 1}, {"n0-1", 1}}
	for _, tc := range []struct {
		name        string
		running     []Placement
		p           Placement
		wantPerByte float64 // 1 / bottleneck, s per byte
		hop         float64
	}{
		{"cross alone: spine 1.5 GB/s over 2 flows", nil, cross, 1 / 0.75e9, hopRack},
		{"local alone: NIC", nil, local, 1 / 1e9, hopNode},
		// other's ring puts a second flow on both rack uplinks (0.5 GB/s
		// each) and two more on the spine (0.375 GB/s each).
		{"cross beside another cross-rack job", []Placement{other}, cross, 1 / 0.375e9, hopRack},
		// other also uses n0-1's NIC, which local's ring crosses.
		{"local beside a job on one of its nodes", []Placement{other}, local, 1 / 0.5e9, hopNode},
		// local shares n0-0's NIC with cross: 0.5 GB/s beats the spine's 0.75.
		{"cross beside a same-rack job", []Placement{local}, cross, 1 / 0.5e9, hopRack},
		{"both", []Placement{local, other}, cross, 1 / 0.375e9, hopRack},
	} {
		t.Run(tc.name, func(t *testing.T) {
			load := tp.NewLinkLoad()
			for _, r := range tc.running {
				if err := load.Add(tp, r); err != nil {
					t.Fatal(err)
				}
			}
			pr, err := tp.PriceUnder(job, tc.p, 0, load)
			if err != nil {
				t.Fatal(err)
			}
			if want := 1e9*tc.wantPerByte + 2*tc.hop; !near(pr.Comm, want) {
				t.Errorf("comm %g, want %g", pr.Comm, want)
			}
		})
	}

	load := tp.NewLinkLoad()
	for _, p := range []Placement{other, local} {
		if err := load.Add(tp, p); err != nil {
			t.Fatal(err)
		}
	}
	before := *load
	before.node, before.rack = append([]int{}, load.node...), append([]int{}, load.rack...)
	if err := load.Remove(tp, Placement{{"n1-1", 0}, {"n0-0", 0}, {"n1-0", 0}}); err == nil || !strings.Contains(err.Error(), "carries no flow") {
		t.Errorf("removing a placement never added: error %v", err)
	}
	if fmt.Sprint(before) != fmt.Sprint(*load) {
		t.Errorf("a failed Remove changed the load: %v -> %v", before, *load)
	}
	for _, p := range []Placement{other, local} {
		if err := load.Remove(tp, p); err != nil {
			t.Fatal(err)
		}
	}
	if fmt.Sprint(*load) != fmt.Sprint(*tp.NewLinkLoad()) {
		t.Errorf("after removing everything: %v", *load)
	}
	small := mustTopology(t, gridSpec(1, 1, 1, 10, 10))
	if _, err := tp.PriceUnder(job, cross, 0, small.NewLinkLoad()); err == nil {
		t.Error("a load from another topology: want an error")
	}
}

// More running jobs never make a placement faster.
func TestMonotoneInLoad(t *testing.T) {
	s := gridSpec(3, 3, 4, 200, 10)
	s.RackUplink.Oversubscription = 3
	s.Spine.Gbps = 40
	tp := mustTopology(t, s)
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := 0; trial < 200; trial++ {
		job := randomJob(rng)
		p := biasedPlacement(rng, tp, 1+rng.IntN(12))
		load := tp.NewLinkLoad()
		prev, err := tp.PriceUnder(job, p, 0, load)
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; k < 5; k++ {
			if err := load.Add(tp, randomPlacement(rng, tp, 1+rng.IntN(12))); err != nil {
				t.Fatal(err)
			}
			pr, err := tp.PriceUnder(job, p, 0, load)
			if err != nil {
				t.Fatal(err)
			}
			if pr.Iteration < prev.Iteration*(1-1e-12) {
				t.Fatalf("trial %d: adding a job made it faster: %g < %g", trial, pr.Iteration, prev.Iteration)
			}
			prev = pr
		}
	}
}

func TestJobValidate(t *testing.T) {
	ok := map[string]float64{"v100": 1}
	for _, tc := range []struct {
		job  JobComm
		want string
	}{
		{JobComm{Name: "a", Bytes: 1, Compute: ok}, ""},
		{JobComm{Name: "a", Bytes: -1, Compute: ok}, `job "a": bytes: want zero or a positive byte count`},
		{JobComm{Name: "a", Bytes: math.Inf(1), Compute: ok}, "bytes"},
		{JobComm{Name: "a", Overlap: 1, Compute: ok}, "overlap: want a fraction in [0, 1)"},
		{JobComm{Name: "a"}, "compute: want a time per iteration for at least one GPU type"},
		{JobComm{Name: "a", Compute: map[string]float64{"v100": 1, "k80": 0, "a100": -1}}, `compute["a100"]: want a positive number of seconds`},
	} {
		err := tc.job.Validate()
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("Validate(%+v) = %v, want %q", tc.job, err, tc.want)
		}
	}
}

// A placement mixing GPU types runs at the pace of its slowest worker and
// is compared with a consolidated run of the same types.
func TestMixedTypes(t *testing.T) {
	tp, err := LoadTopologyFile("examples/uncongested.json")
	if err != nil {
		t.Fatal(err)
	}
	job := &JobComm{Bytes: 1e6, Compute: map[string]float64{"v100": 0.1, "k80": 0.4}}
	pr, err := tp.Price(job, Placement{{"v100-0", 0}, {"k80-0", 0}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if pr.Compute != 0.4 || pr.Locality != CrossRack || pr.Slowdown < 1 {
		t.Errorf("mixed placement: %+v, want compute 0.4 (the K80), cross-rack, slowdown >= 1", pr)
	}
}
