package frame

import "fmt"

// Op is a data-plane request's operation, as both backends put it on the
// wire.
type Op uint8

// The operations.
const (
	OpGet Op = 1
	OpPut Op = 2
)

func (o Op) String() string {
	switch o {
	case OpGet:
		return "get"
	case OpPut:
		return "put"
	}
	return fmt.Sprintf("op 0x%02x", uint8(o))
}

// Request names a request in flight, for errors: an Op of N blocks.
type Request struct {
	Op Op
	N  int
}

// At names the request to the node at addr: "get of 16 blocks from
// host:port".
func (r Request) At(addr string) fmt.Stringer { return requestAt{r, addr} }

type requestAt struct {
	Request
	addr string
}

func (r requestAt) String() string {
	if r.Op == OpGet {
		return fmt.Sprintf("get of %d blocks from %s", r.N, r.addr)
	}
	return fmt.Sprintf("put of %d blocks to %s", r.N, r.addr)
}
