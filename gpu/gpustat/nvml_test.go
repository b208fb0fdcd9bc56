//go:build cgo

package gpustat

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh200"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// busy makes go-nvml's mock H200s report load: the mock server answers
// names and memory; the readings it leaves to the test.
func busy(s *server.Server) {
	for i, d := range s.Devices {
		d := d.(*server.Device)
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: uint32(50 + i)}, nvml.SUCCESS }
		d.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 450_000, nvml.SUCCESS }
		d.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 61, nvml.SUCCESS }
		d.GetPcieThroughputFunc = func(c nvml.PcieUtilCounter) (uint32, nvml.Return) {
			if c == nvml.PCIE_UTIL_TX_BYTES {
				return 1000, nvml.SUCCESS
			}
			return 2000, nvml.SUCCESS
		}
		d.GetFieldValuesFunc = func(fs []nvml.FieldValue) nvml.Return {
			if i == 7 { // one GPU without NVLink
				return nvml.ERROR_NOT_SUPPORTED
			}
			for j := range fs {
				binary.NativeEndian.PutUint64(fs[j].Value[:], uint64(10*(j+1)))
			}
			return nvml.SUCCESS
		}
	}
}

func TestEveryGPUIsExportedWithWhatItReports(t *testing.T) {
	s := dgxh200.New()
	busy(s)
	d, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	snap := d.Snapshot()
	if len(snap) != 8 || !strings.Contains(snap[0].Name, "H200") || snap[0].MemoryTotal <= 140<<30 {
		t.Fatalf("snapshot %+v; want 8 H200s of 141 GB", snap[0])
	}
	if g := snap[3]; g.Utilization != 0.53 || g.PowerWatts != 450 || g.Temperature != 61 || g.PCIeTx != 1000*1024 || g.NVLinkRx != 20*1024 {
		t.Fatalf("GPU 3: %+v", g)
	}
	if snap[7].NVLinkTx != -1 {
		t.Fatalf("GPU 7 has no NVLink, reported %d", snap[7].NVLinkTx)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(d)
	if n, err := testutil.GatherAndCount(reg, "kvstrata_gpu_power_watts"); err != nil || n != 8 {
		t.Fatalf("power of %d GPUs (%v); want 8", n, err)
	}
	if n, _ := testutil.GatherAndCount(reg, "kvstrata_gpu_nvlink_tx_bytes_total"); n != 7 {
		t.Fatalf("NVLink of %d GPUs; want the 7 that have it", n)
	}
	want := `
# HELP kvstrata_gpu_temperature_celsius Temperature of the GPU die.
# TYPE kvstrata_gpu_temperature_celsius gauge
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want+temps(snap)), "kvstrata_gpu_temperature_celsius"); err != nil {
		t.Fatal(err)
	}
}

func temps(snap []Device) string {
	var b strings.Builder
	for _, g := range snap {
		b.WriteString(`kvstrata_gpu_temperature_celsius{gpu="` + string(rune('0'+g.Index)) + `",name="` + g.Name + `",uuid="` + g.UUID + "\"} 61\n")
	}
	return b.String()
}

func TestAMachineWithoutNVMLHasNoGPUMetricsAndSaysWhy(t *testing.T) {
	_, err := Open() // no NVIDIA driver on the test machines; on a GPU machine this opens
	if err == nil {
		t.Skip("this machine has NVML")
	}
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "NVML") {
		t.Fatalf("Open without NVML: %v", err)
	}
}
