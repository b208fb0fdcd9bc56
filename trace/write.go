package trace

import (
	"bufio"
	"encoding/json"
	"io"
)

// Write writes reqs to w in the format Read reads, one JSON object a
// line with the fields in Mooncake's order.
func Write(w io.Writer, reqs []Request) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	for _, r := range reqs {
		ids := r.HashIDs
		if ids == nil {
			ids = []uint64{}
		}
		b, err := json.Marshal(outLine{r.Timestamp, r.InputLength, r.OutputLength, ids})
		if err != nil {
			return err
		}
		bw.Write(b)
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

type outLine struct {
	Timestamp    int64    `json:"timestamp"`
	InputLength  int64    `json:"input_length"`
	OutputLength int64    `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}
