//go:build !linux || !cgo

package nvml

// NewLibrary returns a Library whose Init reports ErrUnavailable: NVML
// needs Linux and cgo (go-nvml loads libnvidia-ml.so through dlopen).
func NewLibrary() Library { return unavailableLib{} }
