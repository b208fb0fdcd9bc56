package respnode

import "time"

// SetClock makes s read the time from now (expiry tests).
func SetClock(s *Store, now func() time.Time) { s.now = now }

// Decode exposes the record decoder to the fuzz test.
var Decode = func(b []byte) error { _, err := decode(b); return err }

// ChunkNamespace is where the chunks of large values are kept.
var ChunkNamespace = chunkNamespace
