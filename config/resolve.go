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
// and the SSD directory. It creates the data directory if needed. It
// reports every problem in one *Error.
func (l *Loaded) Resolve() error {
	var probs []string
	if l.SSD.Dir == "" {
		l.SSD.Dir = filepath.Join(l.DataDir, "ssd")
	}
	if l.DRAM.Capacity == 0 {
		if avail, err := memAvailable(); err != nil {
			probs = append(probs, fmt.Sprintf("dram.capacity is auto, but the available memory is unknown (%v): set it", err))
		} else {
			l.DRAM.Capacity = clamp(avail/4, 64<<20, 64<<30)
			l.Sources["dram.capacity"] = FromAuto
		}
	}
	if l.SSD.Enabled {
		if err := os.MkdirAll(l.SSD.Dir, 0o755); err != nil {
			probs = append(probs, fmt.Sprintf("ssd.dir: %v", err))
		} else if l.SSD.Capacity == 0 {
			var st unix.Statfs_t
			if err := unix.Statfs(l.SSD.Dir, &st); err != nil {
				probs = append(probs, fmt.Sprintf("ssd.capacity is auto, but the free space of %s is unknown (%v): set it", l.SSD.Dir, err))
			} else {
				free := ByteSize(st.Bavail) * ByteSize(st.Bsize)
				l.SSD.Capacity = clamp(free/4, 256<<20, 256<<30)
				l.Sources["ssd.capacity"] = FromAuto
			}
		}
	}
	if l.DRAM.Capacity > 0 && l.DRAM.Capacity < l.Limits.MaxBlockSize {
		probs = append(probs, fmt.Sprintf("dram.capacity %v is below limits.max-block-size %v", l.DRAM.Capacity, l.Limits.MaxBlockSize))
	}
	if len(probs) > 0 {
		return &Error{Problems: probs}
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
func memAvailable() (ByteSize, error) { return memInfo("MemAvailable") }

// memInfo reads one field of /proc/meminfo ("MemTotal").
func memInfo(field string) (ByteSize, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == field+":" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, err
			}
			return ByteSize(kb << 10), nil
		}
	}
	return 0, fmt.Errorf("no %s in /proc/meminfo", field)
}

// machineHolds says why a DRAM tier of capacity bytes cannot be had on
// this machine, if it cannot: it is more than the machine's memory, or more
// than the address space the process may map (ulimit -v). It says nothing
// where the machine does not tell.
func machineHolds(capacity ByteSize) error {
	if total, err := memInfo("MemTotal"); err == nil && capacity > total {
		return fmt.Errorf("is more than this machine's memory, %s (%d bytes)", gib(total), total)
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_AS, &rl); err == nil && rl.Cur != unix.RLIM_INFINITY && uint64(capacity) > rl.Cur {
		return fmt.Errorf("is more than the address space this process may map, %s (ulimit -v)", gib(ByteSize(rl.Cur)))
	}
	return nil
}

func gib(b ByteSize) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }
