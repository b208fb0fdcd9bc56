//go:build cgo

package gpustat

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus"
)

// Devices reads a process's GPUs through NVML. It is a
// prometheus.Collector: each scrape reads the devices afresh.
type Devices struct {
	lib     nvml.Interface
	mu      sync.Mutex
	handles []nvml.Device
	descs   map[string]*prometheus.Desc
}

// Open initialises the machine's NVML. It fails with an error matching
// ErrUnavailable, saying why, where there is none or no device.
func Open() (*Devices, error) { return New(nvml.New()) }

// New reads the devices of lib, an NVML (the machine's, or a stand-in
// such as go-nvml's mock servers); it calls lib.Init.
func New(lib nvml.Interface) (*Devices, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: NVML: %v", ErrUnavailable, ret)
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS || n == 0 {
		lib.Shutdown()
		return nil, fmt.Errorf("%w: NVML sees no device (%v)", ErrUnavailable, ret)
	}
	d := &Devices{lib: lib, descs: map[string]*prometheus.Desc{}}
	for i := range n {
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			lib.Shutdown()
			return nil, fmt.Errorf("%w: NVML device %d: %v", ErrUnavailable, i, ret)
		}
		d.handles = append(d.handles, h)
	}
	for _, m := range metricHelp {
		d.descs[m.name] = prometheus.NewDesc(m.name, m.help, []string{"gpu", "uuid", "name"}, nil)
	}
	return d, nil
}

var metricHelp = []struct{ name, help string }{
	{"kvstrata_gpu_utilization_ratio", "Share of the last sample period in which a kernel ran on the GPU (NVML), 0 to 1."},
	{"kvstrata_gpu_memory_used_bytes", "GPU memory in use."},
	{"kvstrata_gpu_memory_total_bytes", "GPU memory in all."},
	{"kvstrata_gpu_power_watts", "Power the GPU draws."},
	{"kvstrata_gpu_temperature_celsius", "Temperature of the GPU die."},
	{"kvstrata_gpu_pcie_tx_bytes_per_second", "PCIe bytes the GPU sent per second, over the driver's last 20 ms."},
	{"kvstrata_gpu_pcie_rx_bytes_per_second", "PCIe bytes the GPU received per second, over the driver's last 20 ms."},
	{"kvstrata_gpu_nvlink_tx_bytes_total", "NVLink bytes the GPU sent over all its links."},
	{"kvstrata_gpu_nvlink_rx_bytes_total", "NVLink bytes the GPU received over all its links."},
}

// Close shuts NVML down.
func (d *Devices) Close() error {
	if ret := d.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("gpustat: NVML shutdown: %v", ret)
	}
	return nil
}

// Snapshot reads every device now.
func (d *Devices) Snapshot() []Device {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Device, len(d.handles))
	for i, h := range d.handles {
		out[i] = read(i, h)
	}
	return out
}

func read(i int, h nvml.Device) Device {
	dv := Device{Index: i, Utilization: -1, MemoryUsed: -1, MemoryTotal: -1, PowerWatts: -1, Temperature: -1,
		PCIeTx: -1, PCIeRx: -1, NVLinkTx: -1, NVLinkRx: -1}
	if s, ret := h.GetName(); ret == nvml.SUCCESS {
		dv.Name = s
	}
	if s, ret := h.GetUUID(); ret == nvml.SUCCESS {
		dv.UUID = s
	}
	if u, ret := h.GetUtilizationRates(); ret == nvml.SUCCESS {
		dv.Utilization = float64(u.Gpu) / 100
	}
	if m, ret := h.GetMemoryInfo(); ret == nvml.SUCCESS {
		dv.MemoryUsed, dv.MemoryTotal = int64(m.Used), int64(m.Total)
	}
	if mw, ret := h.GetPowerUsage(); ret == nvml.SUCCESS {
		dv.PowerWatts = float64(mw) / 1000
	}
	if c, ret := h.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		dv.Temperature = float64(c)
	}
	if kb, ret := h.GetPcieThroughput(nvml.PCIE_UTIL_TX_BYTES); ret == nvml.SUCCESS {
		dv.PCIeTx = int64(kb) * 1024
	}
	if kb, ret := h.GetPcieThroughput(nvml.PCIE_UTIL_RX_BYTES); ret == nvml.SUCCESS {
		dv.PCIeRx = int64(kb) * 1024
	}
	fields := []nvml.FieldValue{
		{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ScopeId: math.MaxUint32},
		{FieldId: nvml.FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ScopeId: math.MaxUint32},
	}
	if ret := h.GetFieldValues(fields); ret == nvml.SUCCESS {
		for j, f := range fields {
			if nvml.Return(f.NvmlReturn) != nvml.SUCCESS {
				continue
			}
			kib := int64(binary.NativeEndian.Uint64(f.Value[:])) * 1024
			if j == 0 {
				dv.NVLinkTx = kib
			} else {
				dv.NVLinkRx = kib
			}
		}
	}
	return dv
}

// Describe sends the metrics' descriptions.
func (d *Devices) Describe(ch chan<- *prometheus.Desc) {
	for _, desc := range d.descs {
		ch <- desc
	}
}

// Collect reads the devices and sends what each reports.
func (d *Devices) Collect(ch chan<- prometheus.Metric) {
	for _, dv := range d.Snapshot() {
		labels := []string{strconv.Itoa(dv.Index), dv.UUID, dv.Name}
		emit := func(name string, kind prometheus.ValueType, v float64) {
			if v >= 0 {
				ch <- prometheus.MustNewConstMetric(d.descs[name], kind, v, labels...)
			}
		}
		emit("kvstrata_gpu_utilization_ratio", prometheus.GaugeValue, dv.Utilization)
		emit("kvstrata_gpu_memory_used_bytes", prometheus.GaugeValue, float64(dv.MemoryUsed))
		emit("kvstrata_gpu_memory_total_bytes", prometheus.GaugeValue, float64(dv.MemoryTotal))
		emit("kvstrata_gpu_power_watts", prometheus.GaugeValue, dv.PowerWatts)
		emit("kvstrata_gpu_temperature_celsius", prometheus.GaugeValue, dv.Temperature)
		emit("kvstrata_gpu_pcie_tx_bytes_per_second", prometheus.GaugeValue, float64(dv.PCIeTx))
		emit("kvstrata_gpu_pcie_rx_bytes_per_second", prometheus.GaugeValue, float64(dv.PCIeRx))
		emit("kvstrata_gpu_nvlink_tx_bytes_total", prometheus.CounterValue, float64(dv.NVLinkTx))
		emit("kvstrata_gpu_nvlink_rx_bytes_total", prometheus.CounterValue, float64(dv.NVLinkRx))
	}
}
