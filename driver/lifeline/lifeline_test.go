package lifeline

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	log "github.com/hashicorp/go-hclog"
)

const childEnv = "LIFELINE_TEST_CHILD"

// TestMain lets the test binary play a plugin: with childEnv set it
// watches its parent and otherwise sleeps.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		ExitWithParent(log.NewNullLogger())
		time.Sleep(time.Minute)
		os.Exit(3)
	}
	os.Exit(m.Run())
}

// running tells whether pid is alive (a zombie has exited).
func running(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// TestExitWithParent starts the "plugin" under a shell that exits after a
// second without killing it, as a failing Nomad agent does: the plugin
// must keep running while its parent lives and end soon after.
func TestExitWithParent(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	parent := exec.Command("/bin/sh", "-c", `"$0" & echo $!; sleep 1`, self)
	parent.Env = append(os.Environ(), childEnv+"=1")
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("child pid %q: %v", line, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	time.Sleep(300 * time.Millisecond)
	if !running(pid) {
		t.Fatal("plugin exited while its parent was still running")
	}
	if err := parent.Wait(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * Period)
	for running(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("plugin %d still running %v after its parent exited", pid, 3*Period)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
