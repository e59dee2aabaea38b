package trace

import (
	"bytes"
	_ "embed"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"sync"
)

// JobSample is one job of an empirical job distribution: its run time on
// the reference GPU type and its size.
type JobSample struct {
	Seconds float64
	GPUs    int
}

// The (run time, size) pairs of Gavel's philly_job_distribution.pickle:
// data/README.md says where they come from and how they were converted;
// MIT licence in data/LICENSE.gavel.
//
//go:embed data/philly-jobs.csv
var phillyJobsCSV []byte

// Parsed once on first use; callers get a copy, so the table stays as read.
var phillyJobs = sync.OnceValues(func() ([]JobSample, error) { return ParseJobSamples(bytes.NewReader(phillyJobsCSV)) })

// PhillyJobs returns the 33,192 jobs of the Philly trace that Gavel's
// simulator draws run times and sizes from together (1 h to 60 days; 1, 2,
// 4 or 8 GPUs): run time and size are correlated there (1-GPU jobs' median
// 3.0 h, 8-GPU jobs' 17.9 h), which drawing them apart, as GavelDurations
// and PhillySizes do, loses.
func PhillyJobs() []JobSample {
	s, err := phillyJobs()
	if err != nil {
		// A bad embedded file is a build defect the package's tests catch.
		panic(fmt.Sprintf("trace: embedded data/philly-jobs.csv: %v", err))
	}
	return slices.Clone(s)
}

// ParseJobSamples reads a job distribution as CSV with the header
// "seconds,gpus": one job a row, a positive run time in seconds and a
// positive GPU count.
func ParseJobSamples(r io.Reader) ([]JobSample, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = 2
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("job samples: header: %w", err)
	}
	if head[0] != "seconds" || head[1] != "gpus" {
		return nil, fmt.Errorf("job samples: header %q: want \"seconds,gpus\"", head)
	}
	var out []JobSample
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("job samples: %w", err)
		}
		line, _ := cr.FieldPos(0)
		sec, err := strconv.ParseFloat(rec[0], 64)
		if err != nil || !(sec > 0) || math.IsInf(sec, 0) {
			return nil, fmt.Errorf("job samples: line %d: seconds %q: want a positive run time", line, rec[0])
		}
		gpus, err := strconv.Atoi(rec[1])
		if err != nil || gpus <= 0 {
			return nil, fmt.Errorf("job samples: line %d: gpus %q: want a positive number of GPUs", line, rec[1])
		}
		out = append(out, JobSample{Seconds: sec, GPUs: gpus})
	}
	if len(out) == 0 {
		return nil, errors.New("job samples: no jobs after the header")
	}
	return out, nil
}
