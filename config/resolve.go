package config

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// FromAuto marks a value Resolve derived from the machine.
const FromAuto Source = "auto"

// Resolve fills the settings left to the machine: DRAM and SSD capacities
// and the SSD directory. It creates the data directory if needed.
func (l *Loaded) Resolve() error {
	if l.SSD.Dir == "" {
		l.SSD.Dir = filepath.Join(l.DataDir, "ssd")
	}
	if l.DRAM.Capacity == 0 {
		avail, err := memAvailable()
		if err != nil {
			return fmt.Errorf("dram.capacity is auto, but the available memory is unknown (%v): set it", err)
		}
		l.DRAM.Capacity = clamp(avail/4, 64<<20, 64<<30)
		l.Sources["dram.capacity"] = FromAuto
	}
	if l.SSD.Enabled {
		if err := os.MkdirAll(l.SSD.Dir, 0o755); err != nil {
			return fmt.Errorf("ssd.dir: %w", err)
		}
		if l.SSD.Capacity == 0 {
			var st unix.Statfs_t
			if err := unix.Statfs(l.SSD.Dir, &st); err != nil {
				return fmt.Errorf("ssd.capacity is auto, but the free space of %s is unknown (%v): set it", l.SSD.Dir, err)
			}
			free := ByteSize(st.Bavail) * ByteSize(st.Bsize)
			l.SSD.Capacity = clamp(free/4, 256<<20, 256<<30)
			l.Sources["ssd.capacity"] = FromAuto
		}
	}
	if l.DRAM.Capacity < l.Limits.MaxBlockSize {
		return fmt.Errorf("dram.capacity %v is below limits.max-block-size %v", l.DRAM.Capacity, l.Limits.MaxBlockSize)
	}
	if l.Limits.MaxPendingPutBytes == 0 {
		l.Limits.MaxPendingPutBytes = max(l.DRAM.Capacity/4, l.Limits.MaxBlockSize)
		l.Sources["limits.max-pending-put-bytes"] = FromAuto
	}
	return nil
}

func clamp(v, lo, hi ByteSize) ByteSize {
	// Round down to a whole MiB so that the value prints short.
	return max(lo, min(hi, v)) &^ (1<<20 - 1)
}

// memAvailable reads MemAvailable from /proc/meminfo.
func memAvailable() (ByteSize, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemAvailable:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, err
			}
			return ByteSize(kb << 10), nil
		}
	}
	return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
}
