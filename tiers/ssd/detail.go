package ssd

import "github.com/kvstrata/kvstrata/tiers"

var _ tiers.DetailReporter = (*Tier)(nil)

// Detail reports the tier's file system, read when asked: its size
// (disk_total_bytes), its free space (disk_avail_bytes) and the reserve
// the tier leaves free (disk_reserve_bytes), so that a disk filling up —
// with the tier's blocks or anything else — shows before puts are refused.
// It is empty where the file system does not report its space.
func (t *Tier) Detail() map[string]int64 {
	if !t.space.known {
		return nil
	}
	du, err := t.space.fs.GetDiskUsage(t.space.dir)
	if err != nil {
		return nil
	}
	return map[string]int64{"disk_total_bytes": int64(du.TotalBytes), "disk_avail_bytes": int64(du.AvailBytes),
		"disk_reserve_bytes": t.space.reserve}
}
