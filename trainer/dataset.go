package trainer

import (
	"fmt"
	"math/rand/v2"
)

// DataConfig describes the synthetic classification problem: each class is a
// mixture of Gaussian clusters around random centers, so the classes are not
// linearly separable when ClustersPerClass > 1 (the MLP has something to gain
// over softmax regression).
type DataConfig struct {
	Seed             uint64
	Size             int     // samples in total, train plus test
	Dim              int     // features per sample
	Classes          int     // number of labels
	ClustersPerClass int     // Gaussian clusters per class
	Spread           float64 // standard deviation of the cluster centers; the noise around them is 1
	TestFraction     float64 // share of Size held out for evaluation
}

// DefaultDataConfig is the problem the CLI and the report use.
func DefaultDataConfig(seed uint64) DataConfig {
	return DataConfig{Seed: seed, Size: 8000, Dim: 16, Classes: 4, ClustersPerClass: 3, Spread: 1.1, TestFraction: 0.25}
}

// Validate reports the first bad field.
func (c DataConfig) Validate() error {
	switch {
	case c.Size < 2:
		return fmt.Errorf("dataset: field \"size\": want at least 2 samples, got %d", c.Size)
	case c.Dim < 1:
		return fmt.Errorf("dataset: field \"dim\": want at least 1, got %d", c.Dim)
	case c.Classes < 2:
		return fmt.Errorf("dataset: field \"classes\": want at least 2, got %d", c.Classes)
	case c.ClustersPerClass < 1:
		return fmt.Errorf("dataset: field \"clusters_per_class\": want at least 1, got %d", c.ClustersPerClass)
	case !(c.Spread > 0):
		return fmt.Errorf("dataset: field \"spread\": want > 0, got %g", c.Spread)
	case !(c.TestFraction > 0 && c.TestFraction < 1):
		return fmt.Errorf("dataset: field \"test_fraction\": want in (0, 1), got %g", c.TestFraction)
	}
	nTest := int(float64(c.Size) * c.TestFraction)
	if nTest < 1 || c.Size-nTest < 1 {
		return fmt.Errorf("dataset: fields \"size\" %d and \"test_fraction\" %g leave an empty train or test split; raise the size", c.Size, c.TestFraction)
	}
	return nil
}

// Dataset is a set of labelled samples stored row-major in one slice.
type Dataset struct {
	Dim     int
	Classes int
	X       []float64 // Len()*Dim features
	Y       []int     // labels in [0, Classes)
}

// Len is the number of samples.
func (d *Dataset) Len() int { return len(d.Y) }

// Row returns sample i's features (a view, not a copy).
func (d *Dataset) Row(i int) []float64 { return d.X[i*d.Dim : (i+1)*d.Dim] }

// Generate draws the dataset for cfg and splits it into train and test sets.
// Samples are generated in random order, so any split or shard of them is an
// i.i.d. sample of the problem.
func Generate(cfg DataConfig) (train, test *Dataset, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x9e3779b97f4a7c15))
	nCenters := cfg.Classes * cfg.ClustersPerClass
	centers := make([]float64, nCenters*cfg.Dim)
	for i := range centers {
		centers[i] = rng.NormFloat64() * cfg.Spread
	}
	all := &Dataset{Dim: cfg.Dim, Classes: cfg.Classes, X: make([]float64, cfg.Size*cfg.Dim), Y: make([]int, cfg.Size)}
	for i := range cfg.Size {
		c := rng.IntN(nCenters)
		all.Y[i] = c % cfg.Classes
		row := all.Row(i)
		for j := range row {
			row[j] = centers[c*cfg.Dim+j] + rng.NormFloat64()
		}
	}
	nTest := int(float64(cfg.Size) * cfg.TestFraction)
	nTrain := cfg.Size - nTest
	train = &Dataset{Dim: cfg.Dim, Classes: cfg.Classes, X: all.X[:nTrain*cfg.Dim], Y: all.Y[:nTrain]}
	test = &Dataset{Dim: cfg.Dim, Classes: cfg.Classes, X: all.X[nTrain*cfg.Dim:], Y: all.Y[nTrain:]}
	return train, test, nil
}

// Shard returns shard i of k: the samples whose index is i modulo k. Copy i
// of a HadarE job trains on shard i; the shards are disjoint and cover the
// set.
func (d *Dataset) Shard(i, k int) (*Dataset, error) {
	if k < 1 || i < 0 || i >= k {
		return nil, fmt.Errorf("shard %d of %d: want 0 <= index < copies", i, k)
	}
	if d.Len() < k {
		return nil, fmt.Errorf("shard %d of %d: dataset has only %d samples; raise the dataset size", i, k, d.Len())
	}
	s := &Dataset{Dim: d.Dim, Classes: d.Classes}
	for j := i; j < d.Len(); j += k {
		s.X = append(s.X, d.Row(j)...)
		s.Y = append(s.Y, d.Y[j])
	}
	return s, nil
}
