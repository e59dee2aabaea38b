package trainer

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// CompareConfig describes the single-job versus HadarE comparison that
// docs/trainer.md reports.
type CompareConfig struct {
	Models     []Model
	Copies     []int
	Seeds      []uint64
	Steps      int // total steps of every run
	MergeEvery int // mean steps per copy between merges
	// Data and Train give everything but the seed, which each run sets.
	Data  DataConfig
	Train TrainConfig
}

// DefaultCompareConfig is the configuration of the report in docs/trainer.md.
func DefaultCompareConfig() CompareConfig {
	return CompareConfig{
		Models: []Model{Softmax, MLP}, Copies: []int{2, 3, 4}, Seeds: []uint64{1, 2, 3},
		Steps: 4000, MergeEvery: 50,
		Data: DefaultDataConfig(0), Train: DefaultTrainConfig(MLP, 0),
	}
}

// CompareRow is one (model, seed, copies) comparison.
type CompareRow struct {
	Model   Model
	Seed    uint64
	Copies  int
	Speeds  []float64
	Single  Eval
	HadarE  Eval
	NoMerge Eval // the fastest copy alone, never merged
	Merges  int
}

// Compare runs, for every model, seed and copy count, the single job, the
// HadarE copies (DefaultSpeeds) and the unmerged fastest copy, all for the
// same total steps.
func Compare(ctx context.Context, cc CompareConfig) ([]CompareRow, error) {
	var rows []CompareRow
	for _, m := range cc.Models {
		for _, seed := range cc.Seeds {
			dc := cc.Data
			dc.Seed = seed
			train, test, err := Generate(dc)
			if err != nil {
				return nil, err
			}
			tc := cc.Train
			tc.Model, tc.Seed = m, seed
			single, err := RunSingle(ctx, train, test, tc, cc.Steps)
			if err != nil {
				return nil, fmt.Errorf("compare %s seed %d single: %w", m, seed, err)
			}
			for _, k := range cc.Copies {
				hc := HadarEConfig{Copies: k, Speeds: DefaultSpeeds(k), MergeEvery: cc.MergeEvery}
				he, err := RunHadarE(ctx, train, test, tc, cc.Steps, hc)
				if err != nil {
					return nil, fmt.Errorf("compare %s seed %d copies %d: %w", m, seed, k, err)
				}
				hc.NoMerge = true
				nm, err := RunHadarE(ctx, train, test, tc, cc.Steps, hc)
				if err != nil {
					return nil, fmt.Errorf("compare %s seed %d copies %d unmerged: %w", m, seed, k, err)
				}
				rows = append(rows, CompareRow{Model: m, Seed: seed, Copies: k, Speeds: hc.Speeds,
					Single: single.Test, HadarE: he.Test, NoMerge: nm.Test, Merges: he.Merges})
			}
		}
	}
	return rows, nil
}

// WriteCompareTable prints rows as an aligned table, one row per run and a
// mean row per (model, copies).
func WriteCompareTable(w io.Writer, rows []CompareRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "model\tcopies\tspeeds\tseed\tsingle acc\tHadarE acc\tΔacc pp\tsingle loss\tHadarE loss\tΔloss %\tno-merge acc\tno-merge loss\tmerges\t")
	type key struct {
		m Model
		k int
	}
	var order []key
	sums := map[key]*[7]float64{}
	for _, r := range rows {
		dAcc := 100 * (r.HadarE.Accuracy - r.Single.Accuracy)
		dLoss := 100 * (r.HadarE.Loss - r.Single.Loss) / r.Single.Loss
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%.2f%%\t%.2f%%\t%+.2f\t%.4f\t%.4f\t%+.1f\t%.2f%%\t%.4f\t%d\t\n",
			r.Model, r.Copies, speedsString(r.Speeds), r.Seed, 100*r.Single.Accuracy, 100*r.HadarE.Accuracy, dAcc,
			r.Single.Loss, r.HadarE.Loss, dLoss, 100*r.NoMerge.Accuracy, r.NoMerge.Loss, r.Merges)
		k := key{r.Model, r.Copies}
		s, ok := sums[k]
		if !ok {
			s = new([7]float64)
			sums[k] = s
			order = append(order, k)
		}
		for i, v := range []float64{r.Single.Accuracy, r.HadarE.Accuracy, r.Single.Loss, r.HadarE.Loss, r.NoMerge.Accuracy, r.NoMerge.Loss, 1} {
			s[i] += v
		}
	}
	for _, k := range order {
		s := sums[k]
		n := s[6]
		fmt.Fprintf(tw, "%s\t%d\t%s\tmean\t%.2f%%\t%.2f%%\t%+.2f\t%.4f\t%.4f\t%+.1f\t%.2f%%\t%.4f\t\t\n",
			k.m, k.k, speedsString(DefaultSpeeds(k.k)), 100*s[0]/n, 100*s[1]/n, 100*(s[1]-s[0])/n,
			s[2]/n, s[3]/n, 100*(s[3]-s[2])/s[2], 100*s[4]/n, s[5]/n)
	}
	return tw.Flush()
}

func speedsString(s []float64) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = fmt.Sprintf("%.2f", v)
	}
	return strings.Join(parts, ":")
}
