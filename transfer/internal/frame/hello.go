package frame

import (
	"fmt"

	"github.com/kvstrata/kvstrata/transfer"
)

// MaxRefusing is the most connections a data-plane listener refuses at
// once (reading their hello, writing one that says why); beyond it,
// connections over its limit are closed without a word.
const MaxRefusing = 64

// ConnLimitMsg is what the StatusUnavailable hello says to a connection
// over a listener's limit of maxConns connections.
func ConnLimitMsg(maxConns int) string {
	return fmt.Sprintf("node is serving its limit of %d data-plane connections; retry later, pool fewer connections per client, or raise MaxConns",
		maxConns)
}

// HelloAnswer returns the error a client reports for a server's hello
// answer of status st, protocol version ver and message msg to a client
// speaking version want, or nil when the server accepted: ErrRefused or
// ErrUnavailable as the status says, with the server's words.
func HelloAnswer(st Status, ver, want uint8, msg []byte) error {
	switch {
	case st == StatusRefused:
		return fmt.Errorf("%w: %s", transfer.ErrRefused, msg)
	case st == StatusUnavailable:
		return fmt.Errorf("%w: %s", transfer.ErrUnavailable, msg)
	case st == StatusUnauthenticated:
		return fmt.Errorf("%w: %s", transfer.ErrUnauthenticated, msg)
	case st != StatusOK:
		return fmt.Errorf("the node answered: %s", msg)
	case ver != want:
		return fmt.Errorf("the node speaks protocol version %d, this client %d", ver, want)
	}
	return nil
}
