package netmodel

import (
	"bytes"
	_ "embed"
	"fmt"
	"sync"
)

// gavelThroughputsJSON is the trimmed Gavel file the calibration tests read
// (testdata/gavel, MIT licence there), embedded so that binaries calibrate
// without reading testdata at run time.
//
//go:embed testdata/gavel/simulation_throughputs.json
var gavelThroughputsJSON []byte

// GavelData parses the embedded copy of Gavel's simulation throughputs.
func GavelData() (*GavelThroughputs, error) {
	d, err := LoadGavelThroughputs(bytes.NewReader(gavelThroughputsJSON))
	if err != nil {
		return nil, fmt.Errorf("netmodel: embedded testdata/gavel/simulation_throughputs.json: %w", err)
	}
	return d, nil
}

// The default calibration is computed once (about 0.3 s) and shared: a
// CalibrationReport is not modified after Calibrate returns.
var defaultCalibration = sync.OnceValues(func() (*CalibrationReport, error) {
	d, err := GavelData()
	if err != nil {
		return nil, err
	}
	return Calibrate(d, DefaultCalibrationConfig())
})

// DefaultCalibration is Calibrate on the embedded Gavel data with
// DefaultCalibrationConfig: the fit docs/netmodel.md reports.
func DefaultCalibration() (*CalibrationReport, error) { return defaultCalibration() }
