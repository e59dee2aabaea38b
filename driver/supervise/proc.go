package supervise

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"
)

// Proc names one process for good: a pid alone may be given to another
// process once the first is gone; its start time (in clock ticks since
// boot, /proc/<pid>/stat field 22) tells them apart.
type Proc struct {
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
}

// procOf is pid's identity now.
func procOf(pid int) (Proc, error) {
	t, err := startTicks(pid)
	return Proc{PID: pid, StartTicks: t}, err
}

func startTicks(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces
	// and parentheses: the fields that follow start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := bytes.Fields(b[i+1:])
	const starttime = 22 - 3 // field 22, counted from field 3
	if len(f) <= starttime {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	return strconv.ParseUint(string(f[starttime]), 10, 64)
}

// bootID is the kernel's id of this boot ("" if unreadable).
func bootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return string(bytes.TrimSpace(b))
}

// errGone: the process is not there any more (its pid may be someone
// else's now).
var errGone = errors.New("process gone")

// pidfd opens a pidfd on p if p is still the process it names. A pidfd
// keeps naming that process even after its pid is reused, so every later
// check and signal goes through it.
func (p Proc) pidfd() (int, error) {
	if p.PID <= 0 {
		return -1, errGone
	}
	fd, err := unix.PidfdOpen(p.PID, 0)
	if errors.Is(err, unix.ESRCH) {
		return -1, errGone
	}
	if err != nil {
		return -1, fmt.Errorf("pidfd_open %d: %w", p.PID, err)
	}
	// Checked after opening: if the start time still matches, the pid
	// had not been reused when the pidfd was taken.
	t, err := startTicks(p.PID)
	if err != nil || t != p.StartTicks {
		unix.Close(fd)
		return -1, errGone
	}
	return fd, nil
}

// exited tells, without waiting, whether the process behind pidfd ended.
func exited(pidfd int) bool {
	if pidfd < 0 {
		return true
	}
	for {
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err != nil || n > 0
	}
}

// waitExit blocks until the process behind pidfd ends or ctx does. The
// wait is poll(2) on the pidfd and on an eventfd that ctx's end writes,
// so it neither spins nor outlives ctx.
func waitExit(ctx context.Context, pidfd int) error {
	if pidfd < 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("eventfd: %w", err)
	}
	// The eventfd is closed under mu, so a late AfterFunc never writes
	// to a closed (or reused) descriptor.
	var mu sync.Mutex
	closed := false
	defer func() {
		mu.Lock()
		closed = true
		unix.Close(efd)
		mu.Unlock()
	}()
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !closed {
			_, _ = unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		}
	})
	defer stop()
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}, {Fd: int32(efd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("poll pidfd: %w", err)
		}
		if fds[0].Revents != 0 {
			return nil
		}
		if fds[1].Revents != 0 {
			return ctx.Err()
		}
	}
}
