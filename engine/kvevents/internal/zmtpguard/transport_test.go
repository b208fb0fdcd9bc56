package zmtpguard

import (
	"context"
	"testing"

	"github.com/go-zeromq/zmq4"
)

// BenchmarkTransport: 64 KiB messages from a PUSH to a PULL socket over
// zmq4's tcp transport and over the guarded one, side by side.
func BenchmarkTransport(b *testing.B) {
	if err := Register(); err != nil {
		b.Fatal(err)
	}
	for _, scheme := range []string{"tcp", Scheme} {
		b.Run(scheme, func(b *testing.B) {
			ctx := WithLimits(context.Background(), Limits{MaxMessage: 1 << 20})
			pull := zmq4.NewPull(ctx)
			defer pull.Close()
			if err := pull.Listen(scheme + "://127.0.0.1:0"); err != nil {
				b.Fatal(err)
			}
			push := zmq4.NewPush(ctx)
			defer push.Close()
			if err := push.Dial(scheme + "://" + pull.Addr().String()); err != nil {
				b.Fatal(err)
			}
			msg := zmq4.NewMsg(make([]byte, 64<<10))
			b.SetBytes(64 << 10)
			b.ResetTimer()
			go func() {
				for range b.N {
					if push.Send(msg) != nil {
						return
					}
				}
			}()
			for range b.N {
				if _, err := pull.Recv(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
