package frame

import "fmt"

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
