// Command gobuild is `go build -o OUT PKG` that says how far it is: a cold
// build of Nomad compiles about 2,400 packages and takes 5 to 18 minutes
// on two cores, during which go build prints nothing. It counts the
// packages first (go list -deps, which also downloads the modules), then
// runs go build -v and reports packages compiled of the total and the
// time spent: on a terminal in one line rewritten in place, otherwise a
// line every 30 seconds. Compiler errors are printed as go prints them.
//
//	go run ./internal/demo/gobuild [-C DIR] [-name NAME] -o OUT PKG
//
// It uses only the standard library, so `go run` starts it in a second.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "gobuild: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("gobuild", flag.ContinueOnError)
	dir := fs.String("C", "", "run go in this directory (a module of its own, e.g. e2e/tools/nomad)")
	out := fs.String("o", "", "output file")
	name := fs.String("name", "", "what is built, for the messages (default: the package)")
	every := fs.Duration("every", 30*time.Second, "how often a progress line is printed when stdout is not a terminal")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *out == "" {
		return errors.New("usage: gobuild [-C DIR] [-name NAME] -o OUT PKG")
	}
	pkg := fs.Arg(0)
	if *name == "" {
		*name = pkg
	}
	p := &progress{w: stdout, tty: isTerminal(stdout), every: *every, start: time.Now(), name: *name}

	// The packages to compile, and on a cold module cache the modules to
	// download first (go prints "go: downloading" for each).
	p.phase = "resolving packages and downloading modules"
	p.show(true)
	var pkgs []string
	err := goCmd(ctx, *dir, func(line string, isErr bool) {
		if isErr {
			if strings.HasPrefix(line, "go: downloading") {
				p.downloads++
				p.show(false)
			} else {
				p.keep(line)
			}
			return
		}
		pkgs = append(pkgs, line)
	}, "list", "-deps", pkg)
	if err != nil {
		p.end()
		return fmt.Errorf("go list -deps %s: %w\n%s", pkg, err, p.kept())
	}
	p.total = len(pkgs)
	p.phase = "compiling"
	p.show(true)
	err = goCmd(ctx, *dir, func(line string, isErr bool) {
		switch {
		case strings.HasPrefix(line, "go: downloading"):
			p.downloads++
		case !strings.ContainsAny(line, " \t:") && line != "":
			// go build -v names each package as it compiles it.
			p.done++
		default:
			p.keep(line)
		}
		if p.total > 0 && p.done >= p.total {
			p.phase = "linking"
		}
		p.show(false)
	}, "build", "-v", "-o", *out, pkg)
	p.end()
	if err != nil {
		return fmt.Errorf("go build %s: %w\n%s", pkg, err, p.kept())
	}
	fmt.Fprintf(stdout, "built %s into %s in %s (%d packages compiled, %d cached)\n", *name, *out,
		time.Since(p.start).Round(time.Second), p.done, max(0, p.total-p.done))
	return nil
}

// goCmd runs go with args in dir and hands each output line to f (isErr
// for stderr, where go build -v writes).
func goCmd(ctx context.Context, dir string, f func(line string, isErr bool), args ...string) error {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	lines := make(chan [2]string)
	scan := func(r io.Reader, kind string) {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			lines <- [2]string{kind, sc.Text()}
		}
		lines <- [2]string{kind, "\x00eof"}
	}
	go scan(stdout, "out")
	go scan(stderr, "err")
	for open := 2; open > 0; {
		l := <-lines
		if l[1] == "\x00eof" {
			open--
			continue
		}
		f(l[1], l[0] == "err")
	}
	return cmd.Wait()
}

// progress reports how far a build is.
type progress struct {
	w                      io.Writer
	tty                    bool
	every                  time.Duration
	start, last            time.Time
	name, phase            string
	total, done, downloads int
	errs                   []string
	width                  int
}

func (p *progress) line() string {
	s := fmt.Sprintf("  %s: %s", p.name, p.phase)
	if p.total > 0 {
		s += fmt.Sprintf(", %d/%d packages compiled (%d%%)", p.done, p.total, 100*p.done/p.total)
	}
	if p.downloads > 0 {
		s += fmt.Sprintf(", %d modules downloaded", p.downloads)
	}
	return s + fmt.Sprintf(", %s", time.Since(p.start).Round(time.Second))
}

// show prints the progress: rewritten in place on a terminal (at most 4
// times a second), else a line every p.every; force prints at once.
func (p *progress) show(force bool) {
	gap := p.every
	if p.tty {
		gap = 250 * time.Millisecond
	}
	if !force && time.Since(p.last) < gap {
		return
	}
	p.last = time.Now()
	l := p.line()
	if !p.tty {
		fmt.Fprintln(p.w, l)
		return
	}
	pad := max(0, p.width-len(l))
	p.width = len(l)
	fmt.Fprintf(p.w, "\r%s%s", l, strings.Repeat(" ", pad))
}

// end finishes the in-place line.
func (p *progress) end() {
	if p.tty && p.width > 0 {
		fmt.Fprintln(p.w)
	}
}

// keep remembers lines that are not progress (compiler errors, warnings).
func (p *progress) keep(line string) {
	p.errs = append(p.errs, line)
	if len(p.errs) > 200 {
		p.errs = p.errs[len(p.errs)-200:]
	}
}

func (p *progress) kept() string { return strings.Join(p.errs, "\n") }

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
