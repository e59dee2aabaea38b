// Command hadar-trainer is hadar's small real-model trainer: the training
// process of docs/training-contract.md (the default "train" subcommand) and
// the single-job versus HadarE comparison of docs/trainer.md ("compare").
// The logic lives in package trainer/run.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/hadar-sched/hadar/trainer/run"
	"github.com/hadar-sched/hadar/version"
)

func main() {
	if version.IsFlag(os.Args[1:]) {
		fmt.Println(version.String("hadar-trainer"))
		return
	}
	// SIGTERM (the driver's stop) and SIGINT cancel the run, which then
	// checkpoints and exits 0.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := run.Main(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
