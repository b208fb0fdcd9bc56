package raftstore

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kvstrata/kvstrata/index"
)

// This file holds the worker registry: the inference workers that
// registered with the cache cluster, each with a lease, replicated like the
// rest of the cluster state so that every node lists the same workers.
//
// Expiry is deterministic. A record carries the end of its lease as an
// absolute time, which the leader computed from its own clock when it
// proposed the record (registering and renewing are the same upsert);
// replicas never read their clocks when they apply. The leader proposes
// EntryWorkerExpire with a cutoff time now and then, and every replica
// drops exactly the records whose lease ended by that cutoff. Until that
// entry is applied, readers hide records whose lease has ended by their own
// clock (FSM.Workers), so a list never shows a dead lease for as long as a
// sweep takes: what differs between replicas is only the moment each stops
// showing a record, by the skew of their clocks, never the state.

// Bounds of the worker registry. A record or an entry past them is
// refused before it reaches the log (ValidateEntry).
const (
	// MaxWorkers bounds the records the registry holds; an upsert of a
	// new worker beyond it is refused (ErrRegistryFull).
	MaxWorkers = 1024
	// MaxWorkerField bounds each text field of a record, in bytes.
	MaxWorkerField = 512
)

// ErrRegistryFull is an Apply result: an upsert of a new worker into a
// registry that holds MaxWorkers.
var ErrRegistryFull = errors.New("raftstore: the worker registry is full")

// Worker is the record of an inference worker in the registry.
type Worker struct {
	// URL is the base of its OpenAI API (http://host:port): the record's
	// key, non-empty.
	URL string
	// Events and Replay are the ZMQ endpoints of its KV events and their
	// replay socket; "" none.
	Events string
	Replay string
	// Role is aggregated, prefill or decode; "" counts as aggregated.
	Role string
	// Model is its served model name.
	Model string
	// Namespace is the ID of its block namespace; 0 unknown.
	Namespace index.NamespaceID
	// BlockTokens is the tokens per block of its pool; 0 unknown.
	BlockTokens uint32
	// PoolBlocks is its GPU pool, in blocks; 0 unknown.
	PoolBlocks uint64
	// Expires is when its lease ends, by the clock of the leader that
	// recorded it.
	Expires time.Time
}

// Entry types of the registry. They are ignorable: a replica of an older
// build, which serves no registry, skips them without diverging in
// anything it serves.
const (
	// EntryWorkerUpsert registers a worker, or renews its lease:
	//	string URL, events, replay, role, model, u64 namespace,
	//	uvarint block tokens, uvarint pool blocks, time expires
	EntryWorkerUpsert EntryType = Ignorable | 0x01
	// EntryWorkerRemove deregisters a worker: string URL.
	EntryWorkerRemove EntryType = Ignorable | 0x02
	// EntryWorkerExpire drops every worker whose lease ended by a cutoff
	// the leader chose: time cutoff.
	EntryWorkerExpire EntryType = Ignorable | 0x03
)

// EncodeWorkerUpsert returns the data of an entry that registers w or
// renews its lease to w.Expires.
func EncodeWorkerUpsert(w Worker) []byte {
	return appendWorker([]byte{byte(EntryWorkerUpsert)}, w)
}

// EncodeWorkerRemove returns the data of an entry that deregisters the
// worker of url.
func EncodeWorkerRemove(url string) []byte {
	return appendString([]byte{byte(EntryWorkerRemove)}, url)
}

// EncodeWorkerExpire returns the data of an entry that drops every worker
// whose lease ended at or before cutoff.
func EncodeWorkerExpire(cutoff time.Time) []byte {
	return appendTime([]byte{byte(EntryWorkerExpire)}, cutoff)
}

func appendWorker(dst []byte, w Worker) []byte {
	for _, s := range []string{w.URL, w.Events, w.Replay, w.Role, w.Model} {
		dst = appendString(dst, s)
	}
	dst = appendU64(dst, uint64(w.Namespace))
	dst = appendUvarint(dst, uint64(w.BlockTokens))
	dst = appendUvarint(dst, w.PoolBlocks)
	return appendTime(dst, w.Expires)
}

func readWorker(r *reader) Worker {
	return Worker{
		URL:         r.string(),
		Events:      r.string(),
		Replay:      r.string(),
		Role:        r.string(),
		Model:       r.string(),
		Namespace:   index.NamespaceID(r.u64()),
		BlockTokens: r.uint32(),
		PoolBlocks:  r.uvarint(),
		Expires:     r.time(),
	}
}

func appendU64(dst []byte, v uint64) []byte {
	return append(dst, byte(v), byte(v>>8), byte(v>>16), byte(v>>24), byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56))
}

// CheckWorker reports what is wrong with a record a caller wants
// registered: an empty URL, a field over MaxWorkerField, a role not
// aggregated, prefill, decode or "". ValidateEntry checks the same.
func CheckWorker(w Worker) error {
	var probs []string
	if w.URL == "" {
		probs = append(probs, "the URL is empty")
	}
	for name, s := range map[string]string{"URL": w.URL, "events": w.Events, "replay": w.Replay, "role": w.Role, "model": w.Model} {
		if len(s) > MaxWorkerField {
			probs = append(probs, fmt.Sprintf("the %s is %d bytes, over %d", name, len(s), MaxWorkerField))
		}
	}
	switch w.Role {
	case "", "aggregated", "prefill", "decode":
	default:
		if len(w.Role) <= MaxWorkerField {
			probs = append(probs, fmt.Sprintf("role %q is not aggregated, prefill or decode", w.Role))
		}
	}
	if w.Replay != "" && w.Events == "" {
		probs = append(probs, "a replay endpoint without an events endpoint")
	}
	if len(probs) == 0 {
		return nil
	}
	slices.Sort(probs)
	return fmt.Errorf("worker %.64q: %s", w.URL, strings.Join(probs, "; "))
}

// registry is the FSM's worker records by URL. Like roster, a value is
// never changed once published.
type registry struct {
	workers map[string]Worker
}

var emptyRegistry = &registry{workers: map[string]Worker{}}

func (g *registry) upsert(w Worker) (*registry, error) {
	if _, ok := g.workers[w.URL]; !ok && len(g.workers) >= MaxWorkers {
		return g, fmt.Errorf("register worker %q: %w (%d workers)", w.URL, ErrRegistryFull, MaxWorkers)
	}
	n := &registry{workers: maps.Clone(g.workers)}
	n.workers[w.URL] = w
	return n, nil
}

// remove forgets the worker of url; an unknown one is no error, so that
// deregistering twice, or after the lease ended, succeeds.
func (g *registry) remove(url string) *registry {
	if _, ok := g.workers[url]; !ok {
		return g
	}
	n := &registry{workers: maps.Clone(g.workers)}
	delete(n.workers, url)
	return n
}

// expire drops the workers whose lease ended at or before cutoff.
func (g *registry) expire(cutoff time.Time) *registry {
	var n *registry
	for url, w := range g.workers {
		if w.Expires.After(cutoff) {
			continue
		}
		if n == nil {
			n = &registry{workers: maps.Clone(g.workers)}
		}
		delete(n.workers, url)
	}
	if n == nil {
		return g
	}
	return n
}

// sorted returns the records by URL whose lease ends after now; every
// record when now is zero.
func (g *registry) sorted(now time.Time) []Worker {
	out := make([]Worker, 0, len(g.workers))
	for _, w := range g.workers {
		if now.IsZero() || w.Expires.After(now) {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b Worker) int { return strings.Compare(a.URL, b.URL) })
	return out
}

// appendRegistry appends the snapshot encoding of g: a count and the
// records by URL, each as in EntryWorkerUpsert.
func appendRegistry(dst []byte, g *registry) []byte {
	dst = appendUvarint(dst, uint64(len(g.workers)))
	for _, w := range g.sorted(time.Time{}) {
		dst = appendWorker(dst, w)
	}
	return dst
}

func readRegistry(r *reader) *registry {
	g := &registry{workers: map[string]Worker{}}
	for n := r.count(); n > 0; n-- {
		w := readWorker(r)
		g.workers[w.URL] = w
	}
	return g
}

// Workers returns the registered workers whose lease ends after now, by
// URL, from the local replica; every record still held when now is zero.
func (f *FSM) Workers(now time.Time) []Worker { return f.reg().sorted(now) }

// Worker returns the record of the worker of url, whether or not its
// lease has ended.
func (f *FSM) Worker(url string) (Worker, bool) {
	w, ok := f.reg().workers[url]
	return w, ok
}

// WorkersExpired reports whether a record whose lease ended at or before
// now is still held: the leader then proposes EntryWorkerExpire.
func (f *FSM) WorkersExpired(now time.Time) bool {
	for _, w := range f.reg().workers {
		if !w.Expires.After(now) {
			return true
		}
	}
	return false
}

func (f *FSM) reg() *registry {
	if g := f.workers.Load(); g != nil {
		return g
	}
	return emptyRegistry
}

// applyRegistry applies a registry entry; the result is as applyEntry's.
func (f *FSM) applyRegistry(e decoded) error {
	g := f.reg()
	switch e.typ {
	case EntryWorkerUpsert:
		n, err := g.upsert(e.worker)
		if err != nil {
			return err
		}
		g = n
	case EntryWorkerRemove:
		g = g.remove(e.url)
	case EntryWorkerExpire:
		g = g.expire(e.cutoff)
	}
	f.workers.Store(g)
	return nil
}
