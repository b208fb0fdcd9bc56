// Package gpustat reads what operators watch on a GPU beside TTFT and ITL —
// utilisation, memory, power, temperature, PCIe and NVLink traffic —
// through NVIDIA's management library (NVML, with github.com/NVIDIA/go-nvml),
// and exports it as Prometheus metrics and as snapshots for `kvctl stats`.
//
// NVML is loaded at run time (libnvidia-ml.so.1) and go-nvml needs cgo: a
// binary built without cgo, or a machine without NVIDIA's driver, has no
// GPU metrics, and Open says why in one error the caller logs once.
package gpustat

import (
	"errors"
)

// ErrUnavailable marks a process that cannot read its GPUs: no NVML, no
// driver, no device, or a binary built without cgo.
var ErrUnavailable = errors.New("gpustat: no GPU metrics")

// Device is one GPU at one instant. A field the device does not report is
// -1 (a consumer GPU has no NVLink; some report no power).
type Device struct {
	Index       int
	Name        string
	UUID        string
	Utilization float64 // share of the last sample period a kernel ran, 0…1
	MemoryUsed  int64   // bytes
	MemoryTotal int64   // bytes
	PowerWatts  float64
	Temperature float64 // °C, the GPU die
	PCIeTx      int64   // bytes per second, over the driver's last 20 ms
	PCIeRx      int64
	NVLinkTx    int64 // bytes since the driver loaded, all links
	NVLinkRx    int64
}
