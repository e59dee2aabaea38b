package run

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"

	"github.com/hadar-sched/hadar/trainer"
)

const usageText = `usage:
  hadar-trainer [train] [flags]   train per docs/training-contract.md (train -h lists the flags)
  hadar-trainer compare [flags]   single job vs HadarE copies; prints the table of docs/trainer.md
`

// Main is the whole hadar-trainer command behind main: it dispatches the
// subcommand and returns the exit status (0 ok or stopped by ctx after a
// checkpoint, 1 failure, 2 bad usage). ctx is cancelled on SIGTERM/SIGINT.
func Main(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	cmd := "train"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "train":
		o, err := ParseTrainArgs(args, getenv, stderr)
		if err != nil {
			return usageErr(err, stderr)
		}
		if _, err := Run(ctx, o, log, stdout); err != nil {
			log.Error("training failed", "err", err)
			return 1
		}
		return 0
	case "compare":
		cc, err := ParseCompareArgs(args, stderr)
		if err != nil {
			return usageErr(err, stderr)
		}
		rows, err := trainer.Compare(ctx, cc)
		if err != nil {
			log.Error("compare failed", "err", err)
			return 1
		}
		fmt.Fprintf(stdout, "# hadar-trainer compare: %d steps per run, merge every %d steps per copy on average, dataset %d samples dim %d classes %d, batch %d lr %g momentum %g\n",
			cc.Steps, cc.MergeEvery, cc.Data.Size, cc.Data.Dim, cc.Data.Classes, cc.Train.Batch, cc.Train.LR, cc.Train.Momentum)
		if err := trainer.WriteCompareTable(stdout, rows); err != nil {
			log.Error("compare failed", "err", err)
			return 1
		}
		return 0
	case "help":
		fmt.Fprint(stdout, usageText)
		return 0
	}
	fmt.Fprintf(stderr, "unknown subcommand %q\n%s", cmd, usageText)
	return 2
}

func usageErr(err error, stderr io.Writer) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	fmt.Fprintf(stderr, "hadar-trainer: %v\n", err)
	return 2
}

// ParseCompareArgs builds the comparison's configuration from flags.
func ParseCompareArgs(args []string, usage io.Writer) (trainer.CompareConfig, error) {
	cc := trainer.DefaultCompareConfig()
	fs := flag.NewFlagSet("hadar-trainer compare", flag.ContinueOnError)
	fs.SetOutput(usage)
	models := fs.String("models", "softmax,mlp", "models to compare, comma-separated")
	copies := fs.String("copies", "2,3,4", "HadarE copy counts, comma-separated; copy i runs at relative speed 1/(i+1)")
	seeds := fs.String("seeds", "1,2,3", "seeds, comma-separated")
	fs.IntVar(&cc.Steps, "steps", cc.Steps, "total steps of every run (the single job and the sum over the copies)")
	fs.IntVar(&cc.MergeEvery, "merge-every", cc.MergeEvery, "mean steps per copy between merges")
	fs.IntVar(&cc.Train.Hidden, "hidden", cc.Train.Hidden, "hidden units of the mlp")
	fs.IntVar(&cc.Train.Batch, "batch", cc.Train.Batch, "minibatch size")
	fs.Float64Var(&cc.Train.LR, "lr", cc.Train.LR, "learning rate")
	fs.Float64Var(&cc.Train.Momentum, "momentum", cc.Train.Momentum, "SGD momentum")
	fs.IntVar(&cc.Data.Size, "dataset-size", cc.Data.Size, "samples generated, train plus test")
	fs.IntVar(&cc.Data.Dim, "dim", cc.Data.Dim, "features per sample")
	fs.IntVar(&cc.Data.Classes, "classes", cc.Data.Classes, "number of classes")
	if err := fs.Parse(args); err != nil {
		return trainer.CompareConfig{}, err
	}
	if fs.NArg() > 0 {
		return trainer.CompareConfig{}, fmt.Errorf("unexpected argument %q; all options are flags (see compare -h)", fs.Arg(0))
	}
	cc.Models = nil
	for _, s := range strings.Split(*models, ",") {
		m, err := trainer.ParseModel(strings.TrimSpace(s))
		if err != nil {
			return trainer.CompareConfig{}, fmt.Errorf("flag --models: %w", err)
		}
		cc.Models = append(cc.Models, m)
	}
	var err error
	if cc.Copies, err = parseList(*copies, "copies", func(s string) (int, error) {
		k, err := strconv.Atoi(s)
		if err == nil && k < 1 {
			err = fmt.Errorf("want >= 1")
		}
		return k, err
	}); err != nil {
		return trainer.CompareConfig{}, err
	}
	if cc.Seeds, err = parseList(*seeds, "seeds", func(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) }); err != nil {
		return trainer.CompareConfig{}, err
	}
	if cc.Steps < 1 || cc.MergeEvery < 1 {
		return trainer.CompareConfig{}, fmt.Errorf("flags --steps %d and --merge-every %d: want both >= 1", cc.Steps, cc.MergeEvery)
	}
	if err := cc.Data.Validate(); err != nil {
		return trainer.CompareConfig{}, err
	}
	if err := cc.Train.Validate(); err != nil {
		return trainer.CompareConfig{}, err
	}
	return cc, nil
}

func parseList[T any](s, name string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(s, ",") {
		v, err := parse(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("flag --%s: %q: %w; give a comma-separated list like 1,2,3", name, f, err)
		}
		out = append(out, v)
	}
	return out, nil
}
