package daemon

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	pb "github.com/kvstrata/kvstrata/api/v1"
	"github.com/kvstrata/kvstrata/gpu/gpustat"
)

// openGPUs reads the node's GPUs through NVML and registers their metrics
// in reg. Without NVML it logs one line saying why and returns nil: the
// node has no GPU metrics, and Stats no devices.
func openGPUs(reg prometheus.Registerer, log *slog.Logger) *gpustat.Devices {
	d, err := gpustat.Open()
	if err != nil {
		log.Info("no GPU metrics", "why", err)
		return nil
	}
	if err := reg.Register(d); err != nil {
		log.Warn("GPU metrics not registered", "err", err)
	}
	snap := d.Snapshot()
	log.Info("GPU metrics", "devices", len(snap))
	return d
}

// gpusToPB converts a snapshot for Stats.
func gpusToPB(snap []gpustat.Device) []*pb.GPUDevice {
	out := make([]*pb.GPUDevice, len(snap))
	for i, g := range snap {
		out[i] = &pb.GPUDevice{Index: uint32(g.Index), Name: g.Name, Uuid: g.UUID, Utilization: g.Utilization,
			MemoryUsedBytes: g.MemoryUsed, MemoryTotalBytes: g.MemoryTotal, PowerWatts: g.PowerWatts,
			TemperatureCelsius: g.Temperature, PcieTxBytesPerSecond: g.PCIeTx, PcieRxBytesPerSecond: g.PCIeRx,
			NvlinkTxBytes: g.NVLinkTx, NvlinkRxBytes: g.NVLinkRx}
	}
	return out
}
