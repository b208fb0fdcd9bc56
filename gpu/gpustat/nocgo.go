//go:build !cgo

package gpustat

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Devices reads a process's GPUs; in a binary built without cgo there is
// none to read, since NVML is reached through cgo.
type Devices struct{}

// Open fails: this binary was built without cgo.
func Open() (*Devices, error) {
	return nil, fmt.Errorf("%w: this binary was built without cgo, which NVML needs", ErrUnavailable)
}

func (d *Devices) Snapshot() []Device               { return nil }
func (d *Devices) Close() error                     { return nil }
func (d *Devices) Describe(chan<- *prometheus.Desc) {}
func (d *Devices) Collect(chan<- prometheus.Metric) {}
