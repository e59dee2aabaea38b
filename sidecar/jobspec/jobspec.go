// Package jobspec is the contract between a Nomad job and hadar's sidecar:
// which jobs hadar manages (job meta keys prefixed "hadar."), what those
// keys mean, the gate constraint that keeps a managed job pending until the
// sidecar places it, and the job shape the sidecar can rewrite. It is pure:
// it reads an *api.Job and never talks to Nomad. docs/jobspec.md is the
// user-facing description of the same rules.
package jobspec

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/hadar-sched/hadar/contract"
	"github.com/hadar-sched/hadar/planner"
	"github.com/hadar-sched/hadar/planner/queue"
	"github.com/hadar-sched/hadar/sidecar/jobform/groupname"
)

// MetaPrefix starts every meta key hadar reads. A job with at least one
// such key in its job-level meta is managed.
const MetaPrefix = "hadar."

// The job meta keys of the contract.
const (
	KeyModel       = "hadar.model"
	KeyThroughput  = "hadar.throughput"
	KeySteps       = "hadar.steps"
	KeyWorkers     = "hadar.workers"
	KeyWeight      = "hadar.weight"
	KeyForkable    = contract.MetaForkable
	KeySensitivity = "hadar.sensitivity"
	KeyGang        = "hadar.gang"
	KeyMinRunTime  = "hadar.min_run_time"
	KeyQueue       = "hadar.queue"
	// KeyResume asks a new run of the job to resume from its previous
	// run's checkpoints (the task driver reads it too).
	KeyResume = contract.MetaResume
)

// knownKeys lists the keys in the order docs/jobspec.md describes them;
// error messages list them in this order too.
var knownKeys = []string{KeyModel, KeyThroughput, KeySteps, KeyWorkers, KeyWeight, KeyForkable, KeySensitivity, KeyGang, KeyMinRunTime, KeyQueue, KeyResume}

// KnownKeys returns the meta keys of the contract.
func KnownKeys() []string { return append([]string(nil), knownKeys...) }

// Limits on meta values: beyond them a value is almost surely a typo, and
// bounded values keep the planner's arithmetic finite.
const (
	MaxWorkers     = 256
	MaxSteps       = int64(1e12)
	MaxWeight      = 1e6
	MaxSensitivity = 100.0
	MaxThroughput  = 1e9 // steps/s
	MaxMinRunTime  = 30 * 24 * time.Hour
)

// SensitivityAuto is Spec.Sensitivity when hadar.sensitivity is "auto" or
// absent: the network model decides.
const SensitivityAuto = 0.0

// Spec is what the sidecar needs of one managed job, parsed from its meta
// and its shape.
type Spec struct {
	JobID     string
	Namespace string

	// Model is hadar.model: a free name, the key under which every job of
	// the model shares what is learned of its throughputs (a profiled
	// name starts from the profile's figures); empty when
	// hadar.throughput alone describes the job.
	Model string
	// Throughput is hadar.throughput: steps/s of the whole job (all its
	// workers on one node) per GPU type (lowercase planner type names). It
	// overrides the profile's figure for each type it names; nil if absent.
	Throughput map[string]float64
	// Steps is the total number of training steps (hadar.steps).
	Steps int64
	// Workers is the number of GPUs, one per worker (hadar.workers): the
	// width the job asks for first, the smallest of an elastic job's
	// widths.
	Workers int
	// Widths are an elastic job's widths, ascending, Workers the first
	// (hadar.workers as a range "2-8" or a list "2,4,8"); nil for a rigid
	// job (one number).
	Widths []int
	// Weight is the priority weight (hadar.weight).
	Weight float64
	// Forkable lets HadarE fork the job into copies (hadar.forkable).
	Forkable bool
	// Gang asks for all-or-nothing start of the workers (hadar.gang).
	Gang bool
	// Sensitivity is the slowdown when the workers span racks, >= 1, or
	// SensitivityAuto (0) to take it from the network model.
	Sensitivity float64
	// MinRunTime is the least run time before a preemption; 0 means the
	// sidecar's configured default.
	MinRunTime time.Duration
	// Queue is the queue the job asks for (hadar.queue; "": none): the
	// sidecar's queue blocks decide whether it is followed
	// (queue.Config.QueueOf).
	Queue string
	// Priority is Nomad's job priority (0 when the job gives none): it
	// orders jobs inside their queue.
	Priority int

	// Group is the template task group (the job's only group).
	Group string
	// Task is the group's task that requests the GPU.
	Task string
	// Device is the GPU device name as written: "nvidia/gpu", "gpu" or
	// "nvidia/gpu/<model>".
	Device string
	// DeviceModel is <model> of "nvidia/gpu/<model>": the job pinned one GPU
	// model itself. Empty otherwise.
	DeviceModel string
	// Gates are where the job carries the gate constraint (at least one).
	Gates []Gate
}

// FieldError is a problem with one field of a job. Parse returns no other
// error type.
type FieldError struct {
	Job       string
	Namespace string
	// Field is a meta key ("hadar.steps") or a place in the job's shape
	// ("type", `group "train" task "t" device "nvidia/gpu" count`).
	Field string
	// Value is the offending value as written; empty when it is absent.
	Value string
	// Want says what would be accepted, and how to fix it.
	Want string
}

func (e *FieldError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "job %q", e.Job)
	if e.Namespace != "" && e.Namespace != "default" {
		fmt.Fprintf(&b, " (namespace %q)", e.Namespace)
	}
	b.WriteString(": ")
	if strings.HasPrefix(e.Field, MetaPrefix) {
		b.WriteString("meta ")
	}
	b.WriteString(e.Field)
	if e.Value != "" {
		fmt.Fprintf(&b, " = %q", e.Value)
	}
	b.WriteString(": ")
	b.WriteString(e.Want)
	return b.String()
}

// IsManaged reports whether hadar manages job: some key of its job-level
// meta starts with "hadar.". Group and task meta do not count (a job list
// shows job meta only, and the contract is job-level); on a managed job,
// hadar.* keys there are an error in Parse.
func IsManaged(job *api.Job) bool {
	return job != nil && hasHadarKey(job.Meta) && !IsLauncher(job)
}

// IsManagedStub is IsManaged on a job list stub (listed with the "meta"
// parameter): hadar.* meta, and not a launcher.
func IsManagedStub(s *api.JobListStub) bool {
	return s != nil && hasHadarKey(s.Meta) && !s.ParameterizedJob && !s.Periodic
}

// IsLauncher reports a parameterized or periodic job: it never runs
// itself, it launches child jobs (a dispatch, a periodic run) that are
// copies of it. A launcher with hadar.* meta is not managed and never
// written (an edit would reach every later child); the children it
// launches carry its meta and are refused by Parse (see there). A
// dispatched child is not a launcher (Nomad's IsParameterized is false
// once Dispatched is set).
func IsLauncher(job *api.Job) bool {
	return job != nil && (job.IsParameterized() || job.IsPeriodic())
}

func hasHadarKey(m map[string]string) bool {
	for k := range m {
		if strings.HasPrefix(k, MetaPrefix) {
			return true
		}
	}
	return false
}

// Parse reads a managed job's spec. It checks, in this order, the job's
// shape (batch, one task group, one GPU device request of count 1, no
// hadar keys below job level), the gate constraint, unknown hadar.* keys,
// then each key. It returns the first problem as a *FieldError.
func Parse(job *api.Job) (Spec, error) {
	if job == nil {
		return Spec{}, &FieldError{Field: "job", Want: "want a job, got none"}
	}
	p := parser{spec: Spec{JobID: deref(job.ID), Namespace: deref(job.Namespace)}}
	if job.Priority != nil {
		p.spec.Priority = *job.Priority
	}
	if p.spec.Namespace == "" {
		p.spec.Namespace = "default"
	}
	if p.spec.JobID == "" {
		return Spec{}, p.fail("id", "", "want a job ID")
	}
	if err := p.shape(job); err != nil {
		return Spec{}, err
	}
	if err := p.meta(job.Meta); err != nil {
		return Spec{}, err
	}
	return p.spec, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

type parser struct {
	spec Spec
}

func (p *parser) fail(field, value, want string) *FieldError {
	return &FieldError{Job: p.spec.JobID, Namespace: p.spec.Namespace, Field: field, Value: value, Want: want}
}

// GPU device names Parse accepts: Nomad's device-name forms that select
// NVIDIA GPUs (what hadar-gpu and nomad-device-nvidia report).
const (
	deviceGPU       = "gpu"
	deviceNvidiaGPU = "nvidia/gpu"
)

func (p *parser) shape(job *api.Job) error {
	typ := deref(job.Type)
	if typ != "batch" {
		shown := typ
		if shown == "" {
			shown = "service" // Nomad's default
		}
		return p.fail("type", shown, `want "batch": hadar plans batch training jobs only; set type = "batch" or remove the hadar.* meta keys`)
	}
	// hadar places a job by rewriting it, and Nomad's job API cannot
	// rewrite a launched child: the HTTP API drops Dispatched, so the
	// server answers "field 'Dispatched' is read-only" (verified on
	// 1.11.3), and a periodic run written back would lose the ParentID
	// its parent's prohibit_overlap counts on.
	if job.ParentID != nil && *job.ParentID != "" {
		return p.fail("parent", *job.ParentID, "want a job of its own: hadar places a job by rewriting it, and Nomad cannot rewrite a job launched by a parameterized or periodic job (a dispatched job's Dispatched field is read-only through the API); submit each run as its own job, e.g. nomad job run -var steps=N")
	}
	// A launcher is not managed (IsManaged is false); Parse says why if
	// asked.
	if job.IsPeriodic() {
		return p.fail("periodic", "", "want a job that runs: a periodic job only launches runs, which hadar cannot rewrite; submit each run as its own job")
	}
	if job.IsParameterized() {
		return p.fail("parameterized", "", "want a job that runs: a parameterized job only launches dispatched jobs, which hadar cannot rewrite; submit each run as its own job")
	}
	g, err := p.template(job)
	if err != nil {
		return err
	}
	p.spec.Group = deref(g.Name)
	where := fmt.Sprintf("group %q", p.spec.Group)
	if hasHadarKey(g.Meta) {
		return p.fail(where+" meta", firstHadarKey(g.Meta), "want hadar.* keys in the job-level meta block only; move them there")
	}
	for _, t := range g.Tasks {
		if t != nil && hasHadarKey(t.Meta) {
			return p.fail(fmt.Sprintf("%s task %q meta", where, t.Name), firstHadarKey(t.Meta), "want hadar.* keys in the job-level meta block only; move them there")
		}
	}
	if err := p.device(g, where); err != nil {
		return err
	}
	return p.gate(job)
}

// template finds the job's one task group written by its author. Groups
// the sidecar generated from it when placing the job (groupname) are
// hadar's and not checked.
func (p *parser) template(job *api.Job) (*api.TaskGroup, error) {
	const want = "want exactly one task group: the template hadar copies for each placement"
	var own []*api.TaskGroup
	for _, g := range job.TaskGroups {
		if g == nil {
			return nil, p.fail("group", "", want)
		}
		own = append(own, g)
	}
	if len(own) > 1 {
		// With its template present, a generated group is the sidecar's.
		var names []string
		for _, g := range own {
			names = append(names, deref(g.Name))
		}
		own = own[:0]
		for _, g := range job.TaskGroups {
			if w, ok := groupname.Parse(deref(g.Name)); !ok || !slices.Contains(names, w.Template) {
				own = append(own, g)
			}
		}
	}
	if len(own) != 1 {
		return nil, p.fail("group", strconv.Itoa(len(own))+" groups", want)
	}
	return own[0], nil
}

func firstHadarKey(m map[string]string) string {
	var ks []string
	for k := range m {
		if strings.HasPrefix(k, MetaPrefix) {
			ks = append(ks, k)
		}
	}
	sort.Strings(ks)
	return ks[0]
}

// device finds the one GPU request of the template group: exactly one task
// asks for GPUs, through one device block of count 1 (one GPU per worker;
// the sidecar sets the group count to the workers it places).
func (p *parser) device(g *api.TaskGroup, where string) error {
	for _, t := range g.Tasks {
		if t == nil || t.Resources == nil {
			continue
		}
		for _, d := range t.Resources.Devices {
			if d == nil {
				continue
			}
			model, ok := gpuDevice(d.Name)
			if !ok {
				if isGPUName(d.Name) {
					return p.fail(fmt.Sprintf("%s task %q device", where, t.Name), d.Name, `want "nvidia/gpu", "gpu" or "nvidia/gpu/<model>": hadar schedules NVIDIA GPUs as hadar-gpu and nomad-device-nvidia report them`)
				}
				continue // another kind of device (e.g. an FPGA) is the author's business
			}
			field := fmt.Sprintf("%s task %q device %q", where, t.Name, d.Name)
			if p.spec.Task != "" {
				return p.fail(field, "", fmt.Sprintf("want one GPU device request in the group, found a second one (first: task %q device %q); give the group one task that uses the GPU", p.spec.Task, p.spec.Device))
			}
			if d.Count != nil && *d.Count != 1 {
				return p.fail(field+" count", strconv.FormatUint(*d.Count, 10),
					fmt.Sprintf("want count = 1: one GPU per worker; set hadar.workers = \"%d\" for %d GPUs and hadar sets the group count", *d.Count, *d.Count))
			}
			p.spec.Task, p.spec.Device, p.spec.DeviceModel = t.Name, d.Name, model
		}
	}
	if p.spec.Task == "" {
		return p.fail(where+" device", "", `want a task whose resources block has device "nvidia/gpu" { count = 1 }: hadar places GPU jobs only`)
	}
	return nil
}

// gpuDevice accepts the names "gpu", "nvidia/gpu" and "nvidia/gpu/<model>"
// and returns <model>.
func gpuDevice(name string) (model string, ok bool) {
	switch {
	case name == deviceGPU || name == deviceNvidiaGPU:
		return "", true
	case strings.HasPrefix(name, deviceNvidiaGPU+"/") && len(name) > len(deviceNvidiaGPU)+1:
		return name[len(deviceNvidiaGPU)+1:], true
	}
	return "", false
}

// isGPUName tells GPU requests hadar cannot serve (another vendor, an empty
// model) from unrelated devices.
func isGPUName(name string) bool {
	parts := strings.Split(name, "/")
	return len(parts) >= 2 && parts[1] == deviceGPU
}

// meta parses the job-level keys.
func (p *parser) meta(m map[string]string) error {
	var unknown []string
	for k := range m {
		if strings.HasPrefix(k, MetaPrefix) && !isKnownKey(k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		k := unknown[0]
		want := "want one of " + strings.Join(knownKeys, ", ")
		if s := closestKey(k); s != "" {
			want = fmt.Sprintf("unknown key; did you mean %s? (%s)", s, want)
		} else {
			want = "unknown key; " + want
		}
		return p.fail(k, m[k], want)
	}
	s := &p.spec
	var err error
	if v, ok := m[KeyThroughput]; ok {
		if s.Throughput, err = p.throughput(v); err != nil {
			return err
		}
	}
	if v, ok := m[KeyModel]; ok {
		if s.Model = strings.TrimSpace(v); s.Model == "" {
			return p.fail(KeyModel, v, `want a model name: any name, under which the model's throughputs are learned (a profiled one starts from its figures), e.g. hadar.model = "ResNet-18 (batch size 16)"`)
		}
	} else if s.Throughput == nil {
		return p.fail(KeyModel, "", `missing: want hadar.model (a model name, profiled or not, e.g. "ResNet-18 (batch size 16)") or hadar.throughput (e.g. "v100=40,k80=12")`)
	}
	v, ok := m[KeySteps]
	if !ok {
		return p.fail(KeySteps, "", `missing: want a positive integer number of training steps, e.g. hadar.steps = "50000"`)
	}
	if s.Steps, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64); err != nil || s.Steps <= 0 || s.Steps > MaxSteps {
		return p.fail(KeySteps, v, fmt.Sprintf(`want a positive integer number of training steps (at most %d), e.g. hadar.steps = "50000"`, MaxSteps))
	}
	s.Workers = 1
	if v, ok := m[KeyWorkers]; ok {
		ws, want := parseWidths(v)
		if want != "" {
			return p.fail(KeyWorkers, v, want)
		}
		s.Workers = ws[0]
		if len(ws) > 1 {
			s.Widths = ws
		}
	}
	s.Weight = 1
	if v, ok := m[KeyWeight]; ok {
		w, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || !(w > 0) || w > MaxWeight {
			return p.fail(KeyWeight, v, fmt.Sprintf(`want a positive number up to %g, e.g. hadar.weight = "2" (default 1)`, MaxWeight))
		}
		s.Weight = w
	}
	if s.Forkable, err = p.boolean(m, KeyForkable, false); err != nil {
		return err
	}
	if _, err = p.boolean(m, KeyResume, false); err != nil {
		return err
	}
	if s.Forkable && len(s.Widths) > 1 {
		return p.fail(KeyWorkers, m[KeyWorkers], `an elastic job (a range or list of widths) cannot also be hadar.forkable: give one number of workers, or drop hadar.forkable`)
	}
	if s.Gang, err = p.boolean(m, KeyGang, s.Workers > 1 || len(s.Widths) > 1); err != nil {
		return err
	}
	if v, ok := m[KeySensitivity]; ok {
		t := strings.ToLower(strings.TrimSpace(v))
		if t != "auto" {
			x, err := strconv.ParseFloat(t, 64)
			if err != nil || !(x >= 1) || x > MaxSensitivity {
				return p.fail(KeySensitivity, v, fmt.Sprintf(`want "auto" (from the network model) or a slowdown factor from 1 to %g, e.g. hadar.sensitivity = "1.5"`, MaxSensitivity))
			}
			s.Sensitivity = x
		}
	}
	if v, ok := m[KeyMinRunTime]; ok {
		d, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || d <= 0 || d > MaxMinRunTime {
			return p.fail(KeyMinRunTime, v, fmt.Sprintf(`want a positive duration up to %v, e.g. hadar.min_run_time = "30m" (absent: the sidecar's default)`, MaxMinRunTime))
		}
		s.MinRunTime = d
	}
	if v, ok := m[KeyQueue]; ok {
		if s.Queue = strings.TrimSpace(v); !queue.ValidName(s.Queue) {
			return p.fail(KeyQueue, v, `want a queue name of the sidecar's queue blocks (letters, digits, '-', '_', '.'), e.g. hadar.queue = "vision"`)
		}
	}
	return nil
}

// parseWidths reads hadar.workers: one number ("4", rigid), a range
// ("2-8": every width from 2 to 8) or a list ("2,4,8", ascending). It
// returns the widths ascending, or what would be accepted.
func parseWidths(v string) (ws []int, want string) {
	const forms = `an integer number of GPUs from 1 to %d ("4"), or for an elastic job a range ("2-8": every width from 2 to 8) or an ascending list ("2,4,8")`
	bad := func(why string) ([]int, string) {
		return nil, fmt.Sprintf(`%swant %s`, why, fmt.Sprintf(forms, MaxWorkers))
	}
	num := func(t string) (int, bool) {
		n, err := strconv.Atoi(strings.TrimSpace(t))
		return n, err == nil && n >= 1 && n <= MaxWorkers
	}
	t := strings.TrimSpace(v)
	switch {
	case strings.Contains(t, ","):
		for _, f := range strings.Split(t, ",") {
			n, ok := num(f)
			if !ok {
				return bad(fmt.Sprintf("width %q: ", strings.TrimSpace(f)))
			}
			if len(ws) > 0 && n <= ws[len(ws)-1] {
				return bad(fmt.Sprintf("list not ascending (%d after %d): ", n, ws[len(ws)-1]))
			}
			ws = append(ws, n)
		}
	case strings.Contains(t, "-"):
		a, b, _ := strings.Cut(t, "-")
		lo, ok1 := num(a)
		hi, ok2 := num(b)
		if !ok1 || !ok2 {
			return bad("")
		}
		if lo >= hi {
			return bad(fmt.Sprintf("range %d-%d is empty or one width (write one number for a rigid job): ", lo, hi))
		}
		for n := lo; n <= hi; n++ {
			ws = append(ws, n)
		}
	default:
		n, ok := num(t)
		if !ok {
			return bad("")
		}
		ws = []int{n}
	}
	return ws, ""
}

func isKnownKey(k string) bool {
	for _, kk := range knownKeys {
		if k == kk {
			return true
		}
	}
	return false
}

// closestKey suggests the known key within two edits of k, if any.
func closestKey(k string) string {
	best, bestD := "", 3
	for _, kk := range knownKeys {
		if d := editDistance(k, kk); d < bestD {
			best, bestD = kk, d
		}
	}
	return best
}

// editDistance is Levenshtein's distance over bytes; keys are short ASCII.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt // not a typo of a known key; keep fuzzed inputs cheap
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			c := prev[j-1]
			if a[i-1] != b[j-1] {
				c++
			}
			cur[j] = min(c, prev[j]+1, cur[j-1]+1)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func (p *parser) boolean(m map[string]string, key string, def bool) (bool, error) {
	v, ok := m[key]
	if !ok {
		return def, nil
	}
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, p.fail(key, v, fmt.Sprintf(`want "true" or "false" (default %t)`, def))
}

// throughput parses "TYPE=STEPS_PER_SEC[,TYPE=STEPS_PER_SEC...]".
func (p *parser) throughput(v string) (map[string]float64, error) {
	const example = `e.g. hadar.throughput = "v100=40,p100=21.5,k80=12"`
	out := map[string]float64{}
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		typ, rate, ok := strings.Cut(item, "=")
		typ, rate = strings.ToLower(strings.TrimSpace(typ)), strings.TrimSpace(rate)
		if !ok || typ == "" || rate == "" {
			return nil, p.fail(KeyThroughput, v, fmt.Sprintf("entry %q: want TYPE=STEPS_PER_SEC entries separated by commas, %s", item, example))
		}
		if !planner.GPUType(typ).ValidName() {
			return nil, p.fail(KeyThroughput, v, fmt.Sprintf("GPU type %q: want a planner GPU type name of letters, digits, '-' and '_' (e.g. v100), %s", typ, example))
		}
		x, err := strconv.ParseFloat(rate, 64)
		if err != nil || !(x > 0) || x > MaxThroughput {
			return nil, p.fail(KeyThroughput, v, fmt.Sprintf("%s=%s: want a positive number of steps per second up to %g, %s", typ, rate, MaxThroughput, example))
		}
		if _, dup := out[typ]; dup {
			return nil, p.fail(KeyThroughput, v, fmt.Sprintf("GPU type %q given twice: want each type once, %s", typ, example))
		}
		out[typ] = x
	}
	return out, nil
}
