package node

import (
	"context"
	"errors"
	"sync"

	"github.com/kvstrata/kvstrata/index"
	"github.com/kvstrata/kvstrata/tiers"
)

// DefaultFetchConcurrency is the default of Config.FetchConcurrency.
const DefaultFetchConcurrency = 16

// WarmProgress counts a warm's blocks as they are handled.
type WarmProgress struct {
	Done, Total                      int
	Warmed, Already, Missing, Failed int
	Bytes                            int64
	LastError                        error
}

// Warm copies keys up into the tier of the given kind (0: the fastest) from
// the lower tiers holding them, with up to concurrency reads in flight
// (Config.FetchConcurrency when concurrency is 0 or less),
// calling progress (serialised) as blocks complete. It returns early when
// ctx ends.
func (n *Node) Warm(ctx context.Context, keys []index.Key, kind index.TierKind, concurrency int, progress func(WarmProgress)) (WarmProgress, error) {
	if kind == 0 {
		kind = n.h.Kinds()[0]
	}
	if concurrency <= 0 {
		concurrency = n.cfg.FetchConcurrency
	}
	p := WarmProgress{Total: len(keys)}
	var mu sync.Mutex
	next := make(chan index.Key)
	var wg sync.WaitGroup
	for range min(concurrency, len(keys)) {
		wg.Go(func() {
			for k := range next {
				copied, err := n.h.PromoteTo(kind, k)
				var size int64
				if copied && err == nil {
					if m, _, serr := n.h.Stat(k); serr == nil {
						size = int64(m.Size)
					}
				}
				mu.Lock()
				p.Done++
				switch {
				case errors.Is(err, tiers.ErrNotFound):
					p.Missing++
				case err != nil:
					p.Failed++
					p.LastError = err
				case copied:
					p.Warmed++
					p.Bytes += size
				default:
					p.Already++
				}
				if progress != nil {
					progress(p)
				}
				mu.Unlock()
			}
		})
	}
	var err error
feed:
	for _, k := range keys {
		select {
		case next <- k:
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	return p, err
}
