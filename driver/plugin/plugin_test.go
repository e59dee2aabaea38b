package plugin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/hadar-sched/hadar/driver/plugin"
	"github.com/hadar-sched/hadar/driver/plugin/hclspec"
	"github.com/hadar-sched/hadar/driver/plugin/plugintest"
)

// gpuDevice is a device plugin for the protocol tests: two fixed GPUs.
type gpuDevice struct {
	disabled bool
	// failAfter ends the fingerprint stream with this error after the
	// first fingerprint.
	failAfter error
}

var gpuConfigSpec = hclspec.Object(map[string]*hclspec.Spec{
	"enabled": hclspec.Default(hclspec.Attr("enabled", "bool", false), hclspec.Literal("true")),
})

func (g *gpuDevice) PluginInfo() plugin.Info {
	return plugin.Info{Type: plugin.TypeDevice, Name: "gpus", Version: "v0.0.1"}
}
func (g *gpuDevice) ConfigSchema() *hclspec.Spec { return gpuConfigSpec }
func (g *gpuDevice) SetConfig(_ context.Context, c *plugin.Config) error {
	var conf struct {
		Enabled bool `cty:"enabled"`
	}
	if err := gpuConfigSpec.Decode(c.PluginConfig, &conf); err != nil {
		return err
	}
	if c.Agent != nil {
		return fmt.Errorf("a device plugin got the driver's agent config")
	}
	g.disabled = !conf.Enabled
	return nil
}

func (g *gpuDevice) groups() []*plugin.DeviceGroup {
	return []*plugin.DeviceGroup{{
		Vendor: "nvidia", Type: plugin.DeviceTypeGPU, Name: "Tesla T4",
		Attributes: map[string]plugin.Attribute{
			"memory":             plugin.IntAttr(15360, "MiB"),
			"compute_capability": plugin.StringAttr("7.5"),
			"bandwidth":          plugin.FloatAttr(320.5, "GB/s"),
			"mig":                plugin.BoolAttr(false),
		},
		Devices: []*plugin.Device{
			{ID: "gpu-0", Healthy: true, PCIBusID: "0000:3b:00.0"},
			{ID: "gpu-1", Healthy: false, HealthDesc: "XID 79"},
		},
	}}
}

func (g *gpuDevice) Fingerprint(ctx context.Context) (<-chan *plugin.DeviceFingerprint, error) {
	if g.disabled {
		return nil, plugin.ErrDeviceDisabled
	}
	ch := make(chan *plugin.DeviceFingerprint)
	go func() {
		defer close(ch)
		for _, f := range []*plugin.DeviceFingerprint{{Groups: g.groups()}, {Err: g.failAfter}} {
			if f.Err == nil && f.Groups == nil {
				return
			}
			select {
			case ch <- f:
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

func (g *gpuDevice) Reserve(_ context.Context, ids []string) (*plugin.Reservation, error) {
	for _, id := range ids {
		if id != "gpu-0" && id != "gpu-1" {
			return nil, fmt.Errorf("unknown GPU %q", id)
		}
	}
	return &plugin.Reservation{Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(ids, ",")}}, nil
}

func (g *gpuDevice) Stats(ctx context.Context, interval time.Duration) (<-chan *plugin.DeviceStatsReport, error) {
	ch := make(chan *plugin.DeviceStatsReport)
	go func() {
		defer close(ch)
		for i := int64(0); ; i++ {
			rep := &plugin.DeviceStatsReport{Groups: []*plugin.DeviceGroupStats{{
				Vendor: "nvidia", Type: plugin.DeviceTypeGPU, Name: "Tesla T4",
				Instances: map[string]*plugin.DeviceStats{"gpu-0": {
					Summary:   plugin.IntRatioStat(1024*i, 15360, "MiB", "memory used"),
					Stats:     map[string]*plugin.StatValue{"util": plugin.FloatStat(42.5, "%", "GPU utilization")},
					Timestamp: time.Unix(1700000000+i, 0),
				}},
			}}}
			select {
			case ch <- rep:
			case <-ctx.Done():
				return
			}
			select {
			case <-time.After(interval):
			case <-ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}

func within(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func next[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatal("stream closed")
		}
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("nothing on the stream within 10s")
	}
	var zero T
	return zero
}

func attrStrings(m map[string]plugin.Attribute) map[string]string {
	out := map[string]string{}
	for k, a := range m {
		out[k] = fmt.Sprintf("%T:%s", a.Value(), a)
	}
	return out
}

func TestDevicePlugin(t *testing.T) {
	ctx := within(t)
	c := plugintest.Connect(t, &gpuDevice{failAfter: errors.New("NVML went away")})

	info, err := c.PluginInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (plugin.Info{Type: plugin.TypeDevice, Name: "gpus", Version: "v0.0.1", APIVersions: []string{"v0.1.0"}}); !reflect.DeepEqual(info, want) {
		t.Fatalf("info %+v, want %+v", info, want)
	}
	schema, err := c.ConfigSchema(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conf, err := plugintest.PluginConfig(schema, ``)
	if err != nil {
		t.Fatal(err)
	}
	// The agent's driver settings never reach a device plugin.
	if err := c.SetConfig(ctx, conf, &plugin.AgentConfig{ClientMinPort: 1, ClientMaxPort: 2}); err != nil {
		t.Fatal(err)
	}

	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fps, err := c.DeviceFingerprint(fctx)
	if err != nil {
		t.Fatal(err)
	}
	f := next(t, fps)
	if f.Err != nil || len(f.Groups) != 1 {
		t.Fatalf("fingerprint %+v", f)
	}
	g := f.Groups[0]
	if g.Vendor != "nvidia" || g.Type != "gpu" || g.Name != "Tesla T4" {
		t.Errorf("group %s/%s/%s", g.Vendor, g.Type, g.Name)
	}
	wantAttrs := map[string]string{"memory": "int64:15360MiB", "compute_capability": "string:7.5", "bandwidth": "float64:320.5GB/s", "mig": "bool:false"}
	if got := attrStrings(g.Attributes); !reflect.DeepEqual(got, wantAttrs) {
		t.Errorf("attributes %v, want %v", got, wantAttrs)
	}
	if want := []*plugin.Device{{ID: "gpu-0", Healthy: true, PCIBusID: "0000:3b:00.0"}, {ID: "gpu-1", HealthDesc: "XID 79"}}; !reflect.DeepEqual(g.Devices, want) {
		t.Errorf("devices %+v, want %+v", g.Devices, want)
	}
	// An error ends the stream with the plugin's message.
	if f := next(t, fps); f.Err == nil || !strings.Contains(f.Err.Error(), "NVML went away") {
		t.Errorf("second fingerprint %+v, want the plugin's error", f)
	}
	if _, ok := <-fps; ok {
		t.Error("stream still open after an error")
	}

	res, err := c.Reserve(ctx, []string{"gpu-1", "gpu-0"})
	if err != nil || res.Env["NVIDIA_VISIBLE_DEVICES"] != "gpu-1,gpu-0" {
		t.Errorf("reserve: %+v, %v", res, err)
	}
	if _, err := c.Reserve(ctx, []string{"gpu-7"}); err == nil || !strings.Contains(err.Error(), `unknown GPU "gpu-7"`) {
		t.Errorf("reserve of an unknown GPU: %v", err)
	}

	stats, err := c.DeviceStats(fctx, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for i := int64(0); i < 2; i++ {
		r := next(t, stats)
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		st := r.Groups[0].Instances["gpu-0"]
		if *st.Summary.IntNumerator != 1024*i || *st.Summary.IntDenominator != 15360 || st.Summary.Unit != "MiB" || st.Summary.Desc != "memory used" {
			t.Errorf("summary %+v", st.Summary)
		}
		if u := st.Stats["util"]; *u.FloatNumerator != 42.5 || u.FloatDenominator != nil || u.Unit != "%" {
			t.Errorf("util %+v", u)
		}
		if !st.Timestamp.Equal(time.Unix(1700000000+i, 0)) {
			t.Errorf("timestamp %v", st.Timestamp)
		}
	}
}

func TestDeviceDisabled(t *testing.T) {
	ctx := within(t)
	c := plugintest.Connect(t, &gpuDevice{})
	conf, err := plugintest.PluginConfig(gpuConfigSpec.Proto(), `enabled = false`)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(ctx, conf, nil); err != nil {
		t.Fatal(err)
	}
	fps, err := c.DeviceFingerprint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The client's device manager logs this and reports no devices.
	if f := next(t, fps); f.Err == nil || status.Convert(f.Err).Message() != "device is not enabled" {
		t.Fatalf("got %+v, want the disabled error", f)
	}
}

// startProc starts a task of the proc driver running script in sh.
func startProc(t *testing.T, ctx context.Context, c *plugintest.Client, id, script string) (*plugin.TaskConfig, *plugin.TaskHandle) {
	t.Helper()
	schema, err := c.TaskConfigSchema(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := plugintest.DriverConfig(schema, map[string]interface{}{"command": "/bin/sh", "args": []string{"-c", script}})
	if err != nil {
		t.Fatal(err)
	}
	allocDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(allocDir, "work"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := &plugin.TaskConfig{
		ID: id, AllocID: "alloc-" + id, Name: "work", TaskGroupName: "g", JobName: "job", JobID: "job-1",
		Namespace: "default", NodeName: "n1", NodeID: "node-1",
		Env: map[string]string{"PATH": os.Getenv("PATH"), "GREETING": "hi"}, DeviceEnv: map[string]string{"NVIDIA_VISIBLE_DEVICES": "gpu-0"},
		User: "nobody", AllocDir: allocDir,
		StdoutPath: filepath.Join(allocDir, "stdout"), StderrPath: filepath.Join(allocDir, "stderr"),
		Resources: &plugin.Resources{CPUShares: 500, MemoryMB: 256, MemoryMaxMB: 512, Linux: &plugin.LinuxResources{
			CPUPeriod: 100000, CPUQuota: 50000, CPUShares: 500, MemoryLimitBytes: 256 << 20, OOMScoreAdj: 10,
			CpusetCpus: "0-1", PercentTicks: 0.25, CgroupPath: "/sys/fs/cgroup/nomad.slice/share.slice/alloc.work.scope",
		}},
		DriverConfig: dc,
	}
	h, err := c.StartTask(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DestroyTask(context.Background(), id, true) })
	return cfg, h
}

func waitFile(t *testing.T, path, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %q never appeared (have %q)", path, want, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDriverLifecycle(t *testing.T) {
	ctx := within(t)
	d := newProcDriver()
	c := plugintest.Connect(t, d)

	if info, err := c.PluginInfo(ctx); err != nil || info.Type != plugin.TypeDriver || info.Name != "proc" {
		t.Fatalf("info %+v, %v", info, err)
	}
	schema, err := c.ConfigSchema(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := plugintest.PluginConfig(schema, `label = "a b"`)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(ctx, bad, nil); err == nil || status.Convert(err).Message() != `SetConfig failed: label "a b": no blanks` {
		t.Fatalf("bad config: %v", err)
	}
	conf, err := plugintest.PluginConfig(schema, `label = "lab"`)
	if err != nil {
		t.Fatal(err)
	}
	agent := &plugin.AgentConfig{ClientMinPort: 14000, ClientMaxPort: 14512, Topology: &plugin.Topology{
		Cores:                   []plugin.Core{{BaseMHz: 2000}, {MaxMHz: 3000}, {GuessMHz: 1000, Disabled: true}},
		OverrideWithheldCompute: 500,
	}}
	if err := c.SetConfig(ctx, conf, agent); err != nil {
		t.Fatal(err)
	}
	d.mu.Lock()
	gotAgent, gotConf := d.agent, d.conf
	d.mu.Unlock()
	if !reflect.DeepEqual(gotAgent, agent) || gotConf.Label != "lab" {
		t.Fatalf("driver got agent %+v config %+v", gotAgent, gotConf)
	}
	if tc, uc := gotAgent.Topology.TotalCompute(), gotAgent.Topology.UsableCompute(); tc != 6000 || uc != 4500 {
		t.Errorf("compute total %d usable %d, want 6000 and 4500", tc, uc)
	}

	caps, err := c.Capabilities(ctx)
	if err != nil || !reflect.DeepEqual(caps, d.Capabilities()) {
		t.Fatalf("capabilities %+v, %v; want %+v", caps, err, d.Capabilities())
	}

	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fps, err := c.DriverFingerprint(fctx)
	if err != nil {
		t.Fatal(err)
	}
	fp := next(t, fps)
	want := map[string]string{"driver.proc": "bool:true", "driver.proc.label": "string:lab", "driver.proc.cpus": "int64:2", "driver.proc.speed": "float64:2.5GHz"}
	if fp.Health != plugin.HealthHealthy || fp.HealthDescription != "Healthy" || fp.Err != nil || !reflect.DeepEqual(attrStrings(fp.Attributes), want) {
		t.Fatalf("fingerprint %+v (%v)", fp, attrStrings(fp.Attributes))
	}
	// A fingerprint's error travels in it; the stream goes on.
	if fp := next(t, fps); fp.Health != plugin.HealthUnhealthy || fp.Err == nil || fp.Err.Error() != "probe failed" {
		t.Fatalf("second fingerprint %+v", fp)
	}

	events, err := c.TaskEvents(fctx)
	if err != nil {
		t.Fatal(err)
	}
	// Give the events subscription time to reach the driver.
	deadline := time.Now().Add(5 * time.Second)
	for {
		d.mu.Lock()
		n := len(d.events)
		d.mu.Unlock()
		if n > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}

	cfg, h := startProc(t, ctx, c, "t1", `trap 'exit 7' USR1; echo "ready $GREETING $NVIDIA_VISIBLE_DEVICES"; while :; do sleep 0.05; done`)
	// The handle the client stores carries the whole config back.
	if !reflect.DeepEqual(h.Config, cfg) || h.Version != 3 || h.State != plugin.TaskStateRunning {
		t.Fatalf("handle %+v\nconfig %+v\nwant   %+v", h, h.Config, cfg)
	}
	var st struct{ Pid int }
	if err := json.Unmarshal(h.DriverState, &st); err != nil || st.Pid <= 0 {
		t.Fatalf("driver state %q: %v", h.DriverState, err)
	}
	ev := next(t, events)
	if ev.Err != nil || ev.Event.TaskID != "t1" || ev.Event.AllocID != "alloc-t1" || ev.Event.TaskName != "work" || ev.Event.Message != "started" ||
		ev.Event.Annotations["pid"] != fmt.Sprint(st.Pid) || time.Since(ev.Event.Timestamp) > time.Minute {
		t.Fatalf("event %+v", ev.Event)
	}
	waitFile(t, cfg.StdoutPath, "ready hi gpu-0")

	s, err := c.InspectTask(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if s.State != plugin.TaskStateRunning || s.Name != "work" || !s.CompletedAt.IsZero() || time.Since(s.StartedAt) > time.Minute || s.DriverAttributes["pid"] != fmt.Sprint(st.Pid) {
		t.Fatalf("running status %+v", s)
	}

	stats, err := c.TaskStats(fctx, "t1", 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	u := next(t, stats)
	if u.Err != nil || u.Usage.Memory.RSS == 0 || !reflect.DeepEqual(u.Usage.Memory.Measured, []plugin.MemoryField{plugin.MemoryRSS}) ||
		u.Usage.CPU.Percent != 1.5 || !reflect.DeepEqual(u.Usage.CPU.Measured, []plugin.CPUField{plugin.CPUPercent}) {
		t.Fatalf("stats %+v %+v", u.Usage, u.Err)
	}

	if err := c.RecoverTask(ctx, h); err != nil {
		t.Fatalf("recover: %v", err)
	}
	wrong := *h
	wrong.DriverState = []byte(`{"pid": 1}`)
	if err := c.RecoverTask(ctx, &wrong); err == nil || !strings.Contains(err.Error(), "pid 1") {
		t.Fatalf("recover with a wrong state: %v", err)
	}

	if err := c.DestroyTask(ctx, "t1", false); err == nil || !strings.Contains(err.Error(), "running") {
		t.Fatalf("destroy of a running task without force: %v", err)
	}
	if err := c.SignalTask(ctx, "t1", "SIGUSR1"); err != nil {
		t.Fatal(err)
	}
	if r := c.WaitTask(ctx, "t1"); r.Err != nil || r.ExitCode != 7 || r.Signal != 0 {
		t.Fatalf("exit %+v, want code 7", r)
	}
	// WaitTask again answers at once.
	if r := c.WaitTask(ctx, "t1"); r.ExitCode != 7 {
		t.Fatalf("second wait %+v", r)
	}
	s, err = c.InspectTask(ctx, "t1")
	if err != nil || s.State != plugin.TaskStateExited || s.ExitResult.ExitCode != 7 || s.CompletedAt.Before(s.StartedAt) {
		t.Fatalf("exited status %+v, %v", s, err)
	}
	if err := c.DestroyTask(ctx, "t1", false); err != nil {
		t.Fatal(err)
	}
	if _, err := c.InspectTask(ctx, "t1"); status.Code(err) != codes.NotFound {
		t.Fatalf("inspect after destroy: %v", err)
	}
}

func TestDriverStop(t *testing.T) {
	ctx := within(t)
	c := plugintest.Connect(t, newProcDriver())
	tests := []struct {
		name, script, signal string
		timeout              time.Duration
		want                 syscall.Signal
	}{
		{"default signal", `echo ready; while :; do sleep 0.05; done`, "", 5 * time.Second, syscall.SIGTERM},
		{"kill signal", `echo ready; while :; do sleep 0.05; done`, "SIGINT", 5 * time.Second, syscall.SIGINT},
		{"killed after the timeout", `trap '' TERM; echo ready; while :; do sleep 0.05; done`, "SIGTERM", 200 * time.Millisecond, syscall.SIGKILL},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("stop-%d", i)
			cfg, _ := startProc(t, ctx, c, id, tc.script)
			waitFile(t, cfg.StdoutPath, "ready")
			if err := c.StopTask(ctx, id, tc.timeout, "SIGWHAT"); err == nil || !strings.Contains(err.Error(), `unknown signal "SIGWHAT"`) {
				t.Fatalf("unknown signal: %v", err)
			}
			if err := c.StopTask(ctx, id, tc.timeout, tc.signal); err != nil {
				t.Fatal(err)
			}
			if r := c.WaitTask(ctx, id); r.Err != nil || r.Signal != int(tc.want) {
				t.Fatalf("exit %+v, want signal %d", r, tc.want)
			}
		})
	}
}

// Every RPC on a task the driver does not know answers NotFound, the
// code of plugin.ErrTaskNotFound.
func TestDriverTaskNotFound(t *testing.T) {
	ctx := within(t)
	c := plugintest.Connect(t, newProcDriver())
	stats, err := c.TaskStats(ctx, "nope", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]error{
		"WaitTask":    c.WaitTask(ctx, "nope").Err,
		"StopTask":    c.StopTask(ctx, "nope", time.Second, ""),
		"DestroyTask": c.DestroyTask(ctx, "nope", true),
		"SignalTask":  c.SignalTask(ctx, "nope", "SIGTERM"),
		"TaskStats":   next(t, stats).Err,
	}
	_, calls["InspectTask"] = c.InspectTask(ctx, "nope")
	for name, err := range calls {
		if st := status.Convert(err); st.Code() != codes.NotFound || !strings.Contains(st.Message(), "task not found for given id") {
			t.Errorf("%s: %v, want NotFound", name, err)
		}
	}
}

func TestStartTaskErrors(t *testing.T) {
	ctx := within(t)
	d := newProcDriver()
	c := plugintest.Connect(t, d)
	schema, err := c.TaskConfigSchema(ctx)
	if err != nil {
		t.Fatal(err)
	}
	config := func(m map[string]interface{}) []byte {
		b, err := plugintest.DriverConfig(schema, m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "w"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		setup       func()
		config      []byte
		want        string
		recoverable bool
	}{
		{"driver says recoverable", func() { d.startErr = plugin.Recoverable(errors.New("GPUs busy")) }, config(map[string]interface{}{"command": "/bin/true"}), "GPUs busy", true},
		{"command cannot start", nil, config(map[string]interface{}{"command": "/nonexistent/x"}), "/nonexistent/x", true},
		{"config not of the schema", nil, []byte("\x81\xa3foo\x01"), "task w config", false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.setup != nil {
				tc.setup()
			}
			_, err := c.StartTask(ctx, &plugin.TaskConfig{ID: fmt.Sprint("e", i), Name: "w", AllocDir: dir, StdoutPath: filepath.Join(dir, "out"), DriverConfig: tc.config})
			if err == nil || !strings.Contains(err.Error(), tc.want) || plugintest.Recoverable(err) != tc.recoverable {
				t.Fatalf("err %v (recoverable %v), want %q recoverable %v", err, plugintest.Recoverable(err), tc.want, tc.recoverable)
			}
		})
	}
}

func TestPluginSetChecksType(t *testing.T) {
	if _, err := plugin.PluginSet(&wrongType{}); err == nil || !strings.Contains(err.Error(), "implements DevicePlugin but PluginInfo says driver") {
		t.Fatalf("err %v", err)
	}
}

type wrongType struct{ gpuDevice }

func (w *wrongType) PluginInfo() plugin.Info { return plugin.Info{Type: plugin.TypeDriver, Name: "w"} }

// serveEnv makes the test binary a plugin process (TestMain).
const serveEnv = "HADAR_PLUGIN_TEST_SERVE"

func TestMain(m *testing.M) {
	switch os.Getenv(serveEnv) {
	case "device":
		logger := plugin.NewLogger()
		plugin.Serve(&gpuDevice{}, logger)
		os.Exit(0)
	case "driver":
		plugin.Serve(newProcDriver(), plugin.NewLogger())
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestServe launches the test binary as a plugin process, the way the
// Nomad client does (handshake, magic cookie, gRPC), and talks to it.
func TestServe(t *testing.T) {
	for _, kind := range []string{"device", "driver"} {
		t.Run(kind, func(t *testing.T) {
			ctx := within(t)
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), serveEnv+"="+kind)
			c := plugintest.Launch(t, cmd)
			info, err := c.PluginInfo(ctx)
			if err != nil {
				t.Fatal(err)
			}
			schema, err := c.ConfigSchema(ctx)
			if err != nil {
				t.Fatal(err)
			}
			conf, err := plugintest.PluginConfig(schema, "")
			if err != nil {
				t.Fatal(err)
			}
			if err := c.SetConfig(ctx, conf, nil); err != nil {
				t.Fatal(err)
			}
			switch info.Type {
			case plugin.TypeDevice:
				fps, err := c.DeviceFingerprint(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if f := next(t, fps); f.Err != nil || len(f.Groups) != 1 || len(f.Groups[0].Devices) != 2 {
					t.Fatalf("fingerprint %+v", f)
				}
			case plugin.TypeDriver:
				cfg, _ := startProc(t, ctx, c, "served", `echo ready`)
				if r := c.WaitTask(ctx, "served"); r.Err != nil || r.ExitCode != 0 {
					t.Fatalf("exit %+v", r)
				}
				waitFile(t, cfg.StdoutPath, "ready")
			default:
				t.Fatalf("info %+v", info)
			}
		})
	}
}

// Outside a Nomad client the plugin refuses to run.
func TestServeOutsideNomad(t *testing.T) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), serveEnv+"=device")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "plugin") {
		t.Fatalf("exit %v, output %q", err, out)
	}
}
