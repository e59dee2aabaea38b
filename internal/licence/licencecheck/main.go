// Command licencecheck fails when hadar's main module, tests included,
// depends on Business Source Licensed code, or its go.mod or go.sum names
// a BUSL module (package internal/licence has the rules). make lint and
// make test run it:
//
//	go run ./internal/licence/licencecheck [-C DIR]
//
// It uses only the standard library and the main module's own packages.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/hadar-sched/hadar/internal/licence"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := run(ctx, os.Args[1:], os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "licence-check: %v\n", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}

// run checks the module in -C's directory and reports on w; ok is false
// when it found something the module may not use.
func run(ctx context.Context, args []string, w io.Writer) (ok bool, err error) {
	fs := flag.NewFlagSet("licencecheck", flag.ContinueOnError)
	dir := fs.String("C", ".", "the main module's directory (holding go.mod and go.sum)")
	goCmd := fs.String("go", "go", "the go command")
	if err := fs.Parse(args); err != nil {
		return false, err
	}
	goMod, err := os.ReadFile(filepath.Join(*dir, "go.mod"))
	if err != nil {
		return false, err
	}
	goSum, err := os.ReadFile(filepath.Join(*dir, "go.sum"))
	if err != nil && !os.IsNotExist(err) {
		return false, err
	}
	cmd := exec.CommandContext(ctx, *goCmd, licence.ListArgs()...)
	cmd.Dir = *dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return false, fmt.Errorf("%s %s (in %s): %w\n%s", *goCmd, strings.Join(licence.ListArgs(), " "), *dir, err, stderr.String())
	}
	pkgs, err := licence.ReadList(&stdout)
	if err != nil {
		return false, err
	}
	findings := licence.Check(pkgs, goMod, goSum)
	if len(findings) == 0 {
		fmt.Fprintf(w, "licence-check: ok: %d packages (tests included), no Business Source Licensed module, none named in go.mod or go.sum\n", len(pkgs))
		return true, nil
	}
	fmt.Fprintf(w, "licence-check: FAIL: the main module depends on %d module(s) it may not use; remove those imports (Nomad's and Consul's test tools live in e2e/tools, see e2e/tools/README.md), then go mod tidy:\n", len(findings))
	for _, f := range findings {
		fmt.Fprint(w, "  "+f.String())
	}
	return false, nil
}
