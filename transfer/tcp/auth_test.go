package tcp_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvstrata/kvstrata/transfer"
	"github.com/kvstrata/kvstrata/transfer/tcp"
	"github.com/kvstrata/kvstrata/transfer/transfertest"
)

// gated serves its Memory only to connections whose hello carried the
// token "letmein", and counts how often it was asked.
type gated struct {
	*transfertest.Memory
	asked chan transfer.Credentials
}

func (g gated) Authenticate(c transfer.Credentials) (transfer.Handler, error) {
	g.asked <- c
	if c.Token != "letmein" {
		return nil, errors.New("authenticate first")
	}
	return g.Memory, nil
}

// A server whose Handler authenticates asks it once per connection, with
// the token of the client's hello, before any request; a client without
// the right token is turned away with ErrUnauthenticated and the server's
// words, and nothing more.
func TestTheHelloCarriesTheClientsToken(t *testing.T) {
	h := gated{Memory: transfertest.NewMemory(), asked: make(chan transfer.Credentials, 8)}
	ln, err := tcp.New(tcp.Options{}).Listen("127.0.0.1:0", h)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx := context.Background()
	for _, token := range []string{"", "wrong"} {
		_, err := tcp.New(tcp.Options{Token: token}).Dial(ctx, ln.Addr())
		if !errors.Is(err, transfer.ErrUnauthenticated) || !strings.HasSuffix(err.Error(), "authenticate first") {
			t.Errorf("dial with token %q: %v, want ErrUnauthenticated saying authenticate first", token, err)
		}
		if c := <-h.asked; c.Token != token || c.TLS != nil {
			t.Errorf("the handler was asked with %+v, want token %q and no TLS", c, token)
		}
	}
	c, err := tcp.New(tcp.Options{Token: "letmein"}).Dial(ctx, ln.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 3 { // one connection, one authentication, many requests
		if errs, err := c.Put(ctx, []transfer.Block{transfertest.MakeBlock(1, 100)}); err != nil || errs[0] != nil {
			t.Fatal(err, errs)
		}
	}
	if got := len(h.asked); got != 1 {
		t.Errorf("asked %d times for one connection", got)
	}
	if _, ok := h.Block(transfertest.Key(1)); !ok {
		t.Errorf("the put did not reach the handler")
	}
}

func TestATokenOverTheHellosLimitIsInvalid(t *testing.T) {
	_, err := tcp.New(tcp.Options{Token: strings.Repeat("x", 513)}).Dial(context.Background(), "127.0.0.1:1")
	if !errors.Is(err, tcp.ErrInvalidOptions) || !strings.Contains(err.Error(), "Token is 513 bytes") {
		t.Errorf("dial with a 513-byte token: %v", err)
	}
}
