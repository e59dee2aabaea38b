package netmodel

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
)

// CalibrationConfig is the measurement setup Calibrate assumes and the
// search space it explores. Every field is an inferred property of Gavel's
// testbed, documented in docs/netmodel.md; DefaultCalibrationConfig gives
// the values the checked-in report uses.
type CalibrationConfig struct {
	// Models gives each family's parameter count.
	Models []ModelSize
	// BytesPerParam is gradient bytes per parameter (4 for fp32).
	BytesPerParam float64
	// IntraGbps is the GPU-to-GPU bandwidth inside one server per GPU type;
	// types not listed get DefaultIntraGbps.
	IntraGbps        map[string]float64
	DefaultIntraGbps float64
	// IntraLatencyUS and NodeLatencyUS are one-way hop latencies.
	IntraLatencyUS, NodeLatencyUS float64
	// GPUsPerServer is the server size: consolidated runs use one server,
	// spread runs one GPU on each of SF servers behind one switch.
	GPUsPerServer int
	// BandwidthGbps bounds the effective inter-server bandwidth searched.
	BandwidthGbps [2]float64
	// ScaleRange bounds each family's bytes scale (fitted bytes over
	// Params*BytesPerParam).
	ScaleRange [2]float64
	// OverlapGrid lists the overlap fractions tried.
	OverlapGrid []float64
}

// DefaultCalibrationConfig is the setup the documented fit uses.
func DefaultCalibrationConfig() CalibrationConfig {
	var grid []float64
	for i := 0; i <= 18; i++ {
		grid = append(grid, float64(i)*0.05)
	}
	return CalibrationConfig{
		Models:        DefaultModelSizes(),
		BytesPerParam: 4,
		// V100 servers with NVLink (~25 GB/s per ring direction), P100 and
		// K80 servers over PCIe 3.0 (~10 and ~6 GB/s achieved).
		IntraGbps:        map[string]float64{"v100": 200, "p100": 80, "k80": 48},
		DefaultIntraGbps: 80,
		IntraLatencyUS:   5,
		NodeLatencyUS:    10,
		GPUsPerServer:    8,
		BandwidthGbps:    [2]float64{0.5, 400},
		ScaleRange:       [2]float64{1.0 / 16, 16},
		OverlapGrid:      grid,
	}
}

// CalibrationPoint is one (model, scale factor, GPU type) measurement and
// the model's prediction of its spread throughput.
type CalibrationPoint struct {
	GPUType, Model, Family string
	SF                     int
	// Consolidated and Unconsolidated are Gavel's steps/s; Predicted is
	// the model's spread steps/s given Consolidated.
	Consolidated, Unconsolidated, Predicted float64
	// RelErr is |Predicted - Unconsolidated| / Unconsolidated.
	RelErr float64
}

// SkippedPoint is a measurement left out of the fit, with the reason.
type SkippedPoint struct {
	GPUType string
	Key     GavelKey
	Reason  string
}

// ErrorStats summarises relative errors.
type ErrorStats struct {
	N                   int
	Median, Mean, Max   float64
	WithinTenPercent    int
	WithinTwentyPercent int
}

// FamilyFit is one model family's fitted communication volume and error.
type FamilyFit struct {
	Family string
	Params float64
	// BytesScale multiplies Params*BytesPerParam; 1 means the parameter
	// count alone explains the data. Families with no spread measurement
	// keep 1.
	BytesScale float64
	// Bytes is the fitted all-reduce volume per iteration.
	Bytes  float64
	Errors ErrorStats
}

// CalibrationReport is Calibrate's result.
type CalibrationReport struct {
	// BandwidthGbps is the fitted effective inter-server bandwidth;
	// Overlap the fitted compute/communication overlap fraction.
	BandwidthGbps, Overlap float64
	Families               []FamilyFit
	ByGPUType              map[string]ErrorStats
	Points                 []CalibrationPoint
	Skipped                []SkippedPoint
	Overall                ErrorStats
	// Baseline is the error of predicting spread = consolidated (no
	// network model); the fit must beat it to be worth anything.
	Baseline ErrorStats
	// SuperLinear counts points measured faster spread than consolidated,
	// which no placement model can reproduce.
	SuperLinear int
	// measured is the calibration testbed at the fitted bandwidth: compute
	// times are derived on it because that is where Gavel measured.
	measured *Topology
	cfg      CalibrationConfig
}

type calPoint struct {
	CalibrationPoint
	family int
	spread Placement
}

// Calibrate fits the effective inter-server bandwidth, the overlap
// fraction and one bytes scale per model family to Gavel's consolidated
// versus unconsolidated throughputs, minimising the sum of squared
// relative errors of the predicted spread throughput. The search is a grid
// followed by golden-section refinement, in stages, so it is deterministic:
// for each overlap on the grid, fit the bandwidth with every bytes scale at
// 1, then each family's scale (families are independent given the shared
// parameters); keep the overlap whose fit has the least error.
func Calibrate(data *GavelThroughputs, cfg CalibrationConfig) (*CalibrationReport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	famIdx := make(map[string]int, len(cfg.Models))
	for i, m := range cfg.Models {
		famIdx[m.Family] = i
	}
	rep := &CalibrationReport{cfg: cfg, ByGPUType: make(map[string]ErrorStats)}
	types := data.GPUTypes()
	if len(types) == 0 {
		return nil, errors.New("gavel throughputs: no <type> table with a <type>_unconsolidated twin; nothing to calibrate against")
	}
	var pts []calPoint
	for _, gt := range types {
		cons, spread := data.Tables[gt], data.Tables[gt+UnconsolidatedSuffix]
		keys := make([]GavelKey, 0, len(cons))
		for k := range cons {
			keys = append(keys, k)
		}
		sort.Slice(keys, func(i, j int) bool {
			if keys[i].Model != keys[j].Model {
				return keys[i].Model < keys[j].Model
			}
			return keys[i].SF < keys[j].SF
		})
		for _, k := range keys {
			if k.SF < 2 {
				continue // one GPU cannot be spread
			}
			skip := func(reason string) { rep.Skipped = append(rep.Skipped, SkippedPoint{gt, k, reason}) }
			c := cons[k]
			u, ok := spread[k]
			fam := ModelFamily(k.Model)
			fi, known := famIdx[fam]
			switch {
			case c == 0:
				skip("consolidated throughput is 0: the job cannot run on this type (e.g. out of memory)")
			case !ok:
				skip("no unconsolidated measurement")
			case u == 0:
				skip("unconsolidated throughput is 0: the job cannot run spread on this type")
			case k.SF > cfg.GPUsPerServer:
				skip(fmt.Sprintf("scale factor exceeds GPUsPerServer=%d, so the consolidated run is not on one server", cfg.GPUsPerServer))
			case !known:
				skip(fmt.Sprintf("model family %q has no parameter count in the config", fam))
			default:
				p := calPoint{CalibrationPoint: CalibrationPoint{GPUType: gt, Model: k.Model, Family: fam, SF: k.SF,
					Consolidated: c, Unconsolidated: u}, family: fi}
				for i := 0; i < k.SF; i++ {
					p.spread = append(p.spread, Worker{Node: fmt.Sprintf("%s-%d", gt, i), GPU: 0})
				}
				if u > c {
					rep.SuperLinear++
				}
				pts = append(pts, p)
			}
		}
	}
	if len(pts) == 0 {
		return nil, errors.New("gavel throughputs: no usable (model, sf>1, type) pair with both measurements")
	}

	f := fitter{cfg: cfg, types: types, pts: pts, scales: make([]float64, len(cfg.Models))}
	// Bandwidth and the bytes scales are nearly interchangeable (comm time
	// goes as bytes/bandwidth), so each overlap candidate fits the
	// bandwidth with every scale at 1 first; the scales then only absorb
	// what the parameter counts get wrong per family.
	bestObj := math.Inf(1)
	var best fitState
	for _, h := range cfg.OverlapGrid {
		obj, err := f.fitAt(h)
		if err != nil {
			return nil, err
		}
		if obj < bestObj {
			bestObj, best = obj, f.state()
		}
	}
	if err := f.restore(best); err != nil {
		return nil, err
	}
	// Coordinate descent from there: overlap on its grid, then the
	// bandwidth, then the scales, while the objective improves.
	for round := 0; round < 5; round++ {
		if err := f.polish(); err != nil {
			return nil, err
		}
		obj, err := f.objective(-1)
		if err != nil {
			return nil, err
		}
		if obj > bestObj*(1-1e-6) {
			break
		}
		bestObj = obj
	}

	rep.BandwidthGbps, rep.Overlap, rep.measured = f.bandwidth, f.overlap, f.topo
	if _, err := f.objective(-1); err != nil { // fills Predicted and RelErr
		return nil, err
	}
	var all, base []float64
	byType := make(map[string][]float64)
	byFam := make([][]float64, len(cfg.Models))
	for _, p := range f.pts {
		rep.Points = append(rep.Points, p.CalibrationPoint)
		all = append(all, p.RelErr)
		base = append(base, math.Abs(p.Consolidated-p.Unconsolidated)/p.Unconsolidated)
		byType[p.GPUType] = append(byType[p.GPUType], p.RelErr)
		byFam[p.family] = append(byFam[p.family], p.RelErr)
	}
	rep.Overall, rep.Baseline = stats(all), stats(base)
	for gt, e := range byType {
		rep.ByGPUType[gt] = stats(e)
	}
	for i, m := range cfg.Models {
		rep.Families = append(rep.Families, FamilyFit{Family: m.Family, Params: m.Params, BytesScale: f.scales[i],
			Bytes: m.Params * cfg.BytesPerParam * f.scales[i], Errors: stats(byFam[i])})
	}
	return rep, nil
}

func (c *CalibrationConfig) validate() error {
	if len(c.Models) == 0 {
		return errors.New("calibration config: models: want at least one model family with a parameter count")
	}
	for i, m := range c.Models {
		if m.Family == "" || !(m.Params > 0) {
			return fmt.Errorf("calibration config: models[%d]: want a family name and a positive parameter count", i)
		}
	}
	if !(c.BytesPerParam > 0) {
		return fmt.Errorf("calibration config: bytes_per_param: want a positive number, got %g", c.BytesPerParam)
	}
	if !(c.DefaultIntraGbps > 0) {
		return fmt.Errorf("calibration config: default_intra_gbps: want a positive number, got %g", c.DefaultIntraGbps)
	}
	if c.GPUsPerServer < 2 {
		return fmt.Errorf("calibration config: gpus_per_server: want at least 2, got %d", c.GPUsPerServer)
	}
	if !(c.BandwidthGbps[0] > 0) || c.BandwidthGbps[1] <= c.BandwidthGbps[0] {
		return fmt.Errorf("calibration config: bandwidth range: want 0 < low < high, got %v", c.BandwidthGbps)
	}
	if !(c.ScaleRange[0] > 0) || c.ScaleRange[1] <= c.ScaleRange[0] {
		return fmt.Errorf("calibration config: scale range: want 0 < low < high, got %v", c.ScaleRange)
	}
	if len(c.OverlapGrid) == 0 {
		return errors.New("calibration config: overlap grid: want at least one value in [0, 1)")
	}
	for _, h := range c.OverlapGrid {
		if !(h >= 0 && h < 1) {
			return fmt.Errorf("calibration config: overlap grid: want values in [0, 1), got %g", h)
		}
	}
	return nil
}

// fitter holds the state of one calibration run.
type fitter struct {
	cfg       CalibrationConfig
	types     []string
	pts       []calPoint
	scales    []float64
	overlap   float64
	bandwidth float64 // Gbit/s
	topo      *Topology
}

// CalibrationTopology is the testbed Calibrate assumes: per GPU type,
// GPUsPerServer servers of GPUsPerServer GPUs named "<type>-<i>" behind one
// switch, with the given inter-server bandwidth. Exposed so that the fit
// can be checked and replayed.
func CalibrationTopology(cfg CalibrationConfig, types []string, bandwidthGbps float64) (*Topology, error) {
	s := Spec{
		IntraNode:  LinkSpec{Gbps: cfg.DefaultIntraGbps, LatencyUS: cfg.IntraLatencyUS},
		NodeUplink: LinkSpec{Gbps: bandwidthGbps, LatencyUS: cfg.NodeLatencyUS},
	}
	for _, gt := range types {
		s.Racks = append(s.Racks, RackSpec{Name: "rack-" + gt})
		intra := cfg.IntraGbps[gt]
		for i := 0; i < cfg.GPUsPerServer; i++ {
			s.Nodes = append(s.Nodes, NodeSpec{ID: fmt.Sprintf("%s-%d", gt, i), Rack: "rack-" + gt, GPUType: gt,
				GPUs: cfg.GPUsPerServer, IntraGbps: intra})
		}
	}
	return NewTopology(s)
}

type fitState struct {
	overlap, bandwidth float64
	scales             []float64
}

func (f *fitter) state() fitState {
	return fitState{overlap: f.overlap, bandwidth: f.bandwidth, scales: slices.Clone(f.scales)}
}

func (f *fitter) restore(s fitState) error {
	f.overlap = s.overlap
	copy(f.scales, s.scales)
	return f.setBandwidth(s.bandwidth)
}

// fitAt fits bandwidth then scales at overlap h and returns the objective.
func (f *fitter) fitAt(h float64) (float64, error) {
	f.overlap = h
	for i := range f.scales {
		f.scales[i] = 1
	}
	lo, hi := math.Log(f.cfg.BandwidthGbps[0]), math.Log(f.cfg.BandwidthGbps[1])
	lb, _, err := f.minimise(lo, hi, func(x float64) (float64, error) { return f.objectiveBandwidth(math.Exp(x)) })
	if err != nil {
		return 0, err
	}
	if err := f.setBandwidth(math.Exp(lb)); err != nil {
		return 0, err
	}
	if err := f.fitScales(); err != nil {
		return 0, err
	}
	return f.objective(-1)
}

// polish runs one coordinate-descent round over overlap, bandwidth and
// scales, never accepting a worse objective.
func (f *fitter) polish() error {
	bestObj, err := f.objective(-1)
	if err != nil {
		return err
	}
	bestH := f.overlap
	for _, h := range f.cfg.OverlapGrid {
		f.overlap = h
		obj, err := f.objective(-1)
		if err != nil {
			return err
		}
		if obj < bestObj {
			bestObj, bestH = obj, h
		}
	}
	f.overlap = bestH
	keep := f.bandwidth
	lo, hi := math.Log(f.cfg.BandwidthGbps[0]), math.Log(f.cfg.BandwidthGbps[1])
	lb, obj, err := f.minimise(lo, hi, func(x float64) (float64, error) { return f.objectiveBandwidth(math.Exp(x)) })
	if err != nil {
		return err
	}
	if obj < bestObj {
		keep = math.Exp(lb)
	}
	if err := f.setBandwidth(keep); err != nil {
		return err
	}
	return f.fitScales()
}

func (f *fitter) setBandwidth(gbps float64) error {
	tp, err := CalibrationTopology(f.cfg, f.types, gbps)
	if err != nil {
		return err
	}
	f.topo, f.bandwidth = tp, gbps
	return nil
}

func (f *fitter) objectiveBandwidth(gbps float64) (float64, error) {
	if err := f.setBandwidth(gbps); err != nil {
		return 0, err
	}
	return f.objective(-1)
}

// objective is the sum of squared relative errors over the points of one
// family (or all, for family < 0), and records each prediction.
func (f *fitter) objective(family int) (float64, error) {
	var sum float64
	for i := range f.pts {
		p := &f.pts[i]
		if family >= 0 && p.family != family {
			continue
		}
		bytes := f.cfg.Models[p.family].Params * f.cfg.BytesPerParam * f.scales[p.family]
		c, err := f.topo.ComputeTime(p.GPUType, p.SF, p.Consolidated, bytes, f.overlap)
		if err != nil {
			return 0, err
		}
		job := JobComm{Name: p.Model, Bytes: bytes, Overlap: f.overlap, Compute: map[string]float64{p.GPUType: c}}
		pr, err := f.topo.Price(&job, p.spread, 0)
		if err != nil {
			return 0, err
		}
		p.Predicted = pr.Throughput
		p.RelErr = math.Abs(p.Predicted-p.Unconsolidated) / p.Unconsolidated
		sum += p.RelErr * p.RelErr
	}
	return sum, nil
}

func (f *fitter) fitScales() error {
	lo, hi := math.Log(f.cfg.ScaleRange[0]), math.Log(f.cfg.ScaleRange[1])
	for fi := range f.scales {
		has := slices.ContainsFunc(f.pts, func(p calPoint) bool { return p.family == fi })
		if !has {
			continue
		}
		x, _, err := f.minimise(lo, hi, func(x float64) (float64, error) {
			f.scales[fi] = math.Exp(x)
			return f.objective(fi)
		})
		if err != nil {
			return err
		}
		f.scales[fi] = math.Exp(x)
	}
	return nil
}

// minimise finds the minimum of g on [lo, hi]: a 25-point grid picks the
// bracket, golden-section search refines it to 1e-4 in x.
func (f *fitter) minimise(lo, hi float64, g func(float64) (float64, error)) (float64, float64, error) {
	const gridN = 25
	step := (hi - lo) / (gridN - 1)
	bestI, bestV := 0, math.Inf(1)
	for i := 0; i < gridN; i++ {
		v, err := g(lo + float64(i)*step)
		if err != nil {
			return 0, 0, err
		}
		if v < bestV {
			bestI, bestV = i, v
		}
	}
	a, b := lo+float64(max(bestI-1, 0))*step, lo+float64(min(bestI+1, gridN-1))*step
	invPhi := (math.Sqrt(5) - 1) / 2
	x1, x2 := b-invPhi*(b-a), a+invPhi*(b-a)
	f1, err := g(x1)
	if err != nil {
		return 0, 0, err
	}
	f2, err := g(x2)
	if err != nil {
		return 0, 0, err
	}
	for b-a > 1e-4 {
		if f1 <= f2 {
			b, x2, f2 = x2, x1, f1
			x1 = b - invPhi*(b-a)
			if f1, err = g(x1); err != nil {
				return 0, 0, err
			}
		} else {
			a, x1, f1 = x1, x2, f2
			x2 = a + invPhi*(b-a)
			if f2, err = g(x2); err != nil {
				return 0, 0, err
			}
		}
	}
	x, v := x1, f1
	if f2 < f1 {
		x, v = x2, f2
	}
	if bestV < v { // the grid point beat the refinement (flat or noisy g)
		x, v = lo+float64(bestI)*step, bestV
	}
	return x, v, nil
}

func stats(e []float64) ErrorStats {
	s := ErrorStats{N: len(e)}
	if len(e) == 0 {
		return s
	}
	sorted := slices.Clone(e)
	slices.Sort(sorted)
	if len(sorted)%2 == 1 {
		s.Median = sorted[len(sorted)/2]
	} else {
		s.Median = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
	}
	for _, v := range sorted {
		s.Mean += v
		if v <= 0.10 {
			s.WithinTenPercent++
		}
		if v <= 0.20 {
			s.WithinTwentyPercent++
		}
	}
	s.Mean /= float64(len(sorted))
	s.Max = sorted[len(sorted)-1]
	return s
}

// Family returns the fit of one model family.
func (r *CalibrationReport) Family(family string) (FamilyFit, bool) {
	for _, f := range r.Families {
		if f.Family == family {
			return f, true
		}
	}
	return FamilyFit{}, false
}

// Job builds the JobComm of a Gavel model ("ResNet-50 (batch size 64)") at
// scale factor sf from its consolidated throughputs per GPU type, with the
// fitted bytes and overlap. Compute times are derived on the calibration
// testbed (one server holds all sf GPUs, as in Gavel's measurements), so
// the job can then be priced on any topology, including one whose nodes
// are too small to hold it. This is how the simulator turns a throughput
// profile into something it can price.
func (r *CalibrationReport) Job(model string, sf int, consolidated map[string]float64) (JobComm, error) {
	fam, ok := r.Family(ModelFamily(model))
	if !ok {
		return JobComm{}, fmt.Errorf("model %q: family %q has no parameter count; add it to CalibrationConfig.Models", model, ModelFamily(model))
	}
	if r.measured == nil {
		return JobComm{}, errors.New("calibration report: not produced by Calibrate; call Calibrate first")
	}
	j := JobComm{Name: model, Bytes: fam.Bytes, Overlap: r.Overlap, Compute: make(map[string]float64, len(consolidated))}
	for gt, thr := range consolidated {
		if thr == 0 {
			continue // cannot run on this type
		}
		tp := r.measured
		if _, ok := tp.refs[gt]; !ok || sf > tp.refs[gt].maxGPUs {
			// A type or size the testbed lacks: one server of sf GPUs of
			// this type with the default intra-node bandwidth stands in.
			var err error
			cfg := r.cfg
			cfg.GPUsPerServer = max(cfg.GPUsPerServer, sf)
			if tp, err = CalibrationTopology(cfg, []string{gt}, r.BandwidthGbps); err != nil {
				return JobComm{}, err
			}
		}
		c, err := tp.ComputeTime(gt, sf, thr, fam.Bytes, r.Overlap)
		if err != nil {
			return JobComm{}, fmt.Errorf("model %q on %s: %w", model, gt, err)
		}
		j.Compute[gt] = c
	}
	if err := j.Validate(); err != nil {
		return JobComm{}, err
	}
	return j, nil
}

// WriteMarkdown writes the fitted parameters and the error tables that
// docs/netmodel.md reproduces.
func (r *CalibrationReport) WriteMarkdown(w io.Writer) error {
	pct := func(v float64) string { return fmt.Sprintf("%.1f %%", 100*v) }
	var b []byte
	add := func(format string, a ...any) { b = fmt.Appendf(b, format, a...) }
	add("Fitted: effective inter-server bandwidth %.2f Gbit/s, overlap %.2f.\n\n", r.BandwidthGbps, r.Overlap)
	add("| family | params (inferred) | bytes scale | bytes/iteration | points | median err | mean err | max err | within 10 %% | within 20 %% |\n")
	add("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, f := range r.Families {
		if f.Errors.N == 0 {
			add("| %s | %.1fM | %.2f (not fitted) | %.1f MB | 0 | - | - | - | - | - |\n", f.Family, f.Params/1e6, f.BytesScale, f.Bytes/1e6)
			continue
		}
		add("| %s | %.1fM | %.2f | %.1f MB | %d | %s | %s | %s | %d | %d |\n", f.Family, f.Params/1e6, f.BytesScale, f.Bytes/1e6,
			f.Errors.N, pct(f.Errors.Median), pct(f.Errors.Mean), pct(f.Errors.Max), f.Errors.WithinTenPercent, f.Errors.WithinTwentyPercent)
	}
	add("\n| GPU type | points | median err | mean err | max err |\n|---|---|---|---|---|\n")
	types := make([]string, 0, len(r.ByGPUType))
	for t := range r.ByGPUType {
		types = append(types, t)
	}
	sort.Strings(types)
	for _, t := range types {
		e := r.ByGPUType[t]
		add("| %s | %d | %s | %s | %s |\n", t, e.N, pct(e.Median), pct(e.Mean), pct(e.Max))
	}
	add("| **all** | %d | %s | %s | %s |\n", r.Overall.N, pct(r.Overall.Median), pct(r.Overall.Mean), pct(r.Overall.Max))
	add("| no network model (spread = consolidated) | %d | %s | %s | %s |\n", r.Baseline.N, pct(r.Baseline.Median), pct(r.Baseline.Mean), pct(r.Baseline.Max))
	add("\n%d of %d points are faster spread than consolidated (no placement model can reproduce them). Skipped:\n\n", r.SuperLinear, r.Overall.N)
	for _, s := range r.Skipped {
		add("- %s %s sf=%d: %s\n", s.GPUType, s.Key.Model, s.Key.SF, s.Reason)
	}
	add("\nWorst ten points:\n\n| type | model | sf | consolidated | spread measured | spread predicted | err |\n|---|---|---|---|---|---|---|\n")
	worst := slices.Clone(r.Points)
	sort.SliceStable(worst, func(i, j int) bool { return worst[i].RelErr > worst[j].RelErr })
	for _, p := range worst[:min(10, len(worst))] {
		add("| %s | %s | %d | %.2f | %.2f | %.2f | %s |\n", p.GPUType, p.Model, p.SF, p.Consolidated, p.Unconsolidated, p.Predicted, pct(p.RelErr))
	}
	_, err := w.Write(b)
	return err
}
