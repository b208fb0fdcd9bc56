package resp

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// keyOps is what the key commands read and write through: the Store
// itself (direct), or, while EXEC runs, a transaction's overlay of its
// pending writes on the Store.
type keyOps interface {
	view(key string) (value []byte, release func(), err error)
	exists(key string) (bool, error)
	stat(key string) (KeyInfo, error)
	setWith(key string, value []byte, opts SetOptions) (bool, error)
	del(key string) (bool, error)
	expire(key string, at time.Time) (old time.Time, err error)
	apply(ws []Write) error
}

// lacksError is the error of a command that needs a power of KeyStore the
// Store lacks; the reply names the command.
type lacksError struct{ power string }

func (e *lacksError) Error() string { return "needs a store that " + e.power }

var (
	errNoBatches = &lacksError{"applies batches atomically (resp.KeyStore); this server's store cannot"}
	errNoExpiry  = &lacksError{"keeps deadlines (resp.KeyStore); this server's store cannot, its keys never expire"}
	errNoStat    = &lacksError{"describes keys (resp.KeyStore); this server's store cannot"}
	errNoScan    = &lacksError{"can list its keys (resp.KeyStore); this server's store cannot"}
)

// keys is what c's key commands go through now.
func (c *conn) keys() keyOps {
	if c.multi.tx != nil {
		return c.multi.tx
	}
	return &c.direct
}

// direct is the Store itself, through KeyStore where it has it, for a
// connection: ctx carries the identity it authenticated as, if any.
type direct struct {
	s   *Server
	ctx context.Context
}

func (d *direct) view(key string) ([]byte, func(), error) { return d.s.store.View(d.ctx, key) }

func (d *direct) exists(key string) (bool, error) { return d.s.store.Exists(d.ctx, key) }

func (d *direct) stat(key string) (KeyInfo, error) {
	if d.s.ks == nil {
		return KeyInfo{}, errNoStat
	}
	return d.s.ks.Stat(d.ctx, key)
}

func (d *direct) setWith(key string, value []byte, opts SetOptions) (bool, error) {
	if d.s.ks != nil {
		return d.s.ks.SetWith(d.ctx, key, value, opts)
	}
	if !opts.ExpireAt.IsZero() || opts.KeepTTL {
		return false, errNoExpiry
	}
	if opts.Cond == SetAlways {
		return true, d.s.store.Set(d.ctx, key, value)
	}
	exists := opts.Cond == SetIfPresent
	if d.s.cond != nil {
		return d.s.cond.SetIf(d.ctx, key, value, exists)
	}
	ok, err := d.s.store.Exists(d.ctx, key)
	if err != nil || ok != exists {
		return false, err
	}
	return true, d.s.store.Set(d.ctx, key, value)
}

func (d *direct) del(key string) (bool, error) { return d.s.store.Delete(d.ctx, key) }

func (d *direct) expire(key string, at time.Time) (time.Time, error) {
	if d.s.ks == nil {
		return time.Time{}, errNoExpiry
	}
	return d.s.ks.Expire(d.ctx, key, at)
}

func (d *direct) apply(ws []Write) error {
	switch {
	case d.s.ks != nil:
		return d.s.ks.Apply(d.ctx, ws)
	case len(ws) == 1 && !ws[0].Delete && ws[0].ExpireAt.IsZero():
		return d.s.store.Set(d.ctx, ws[0].Key, ws[0].Value)
	default:
		return errNoBatches
	}
}

// overlay is a transaction being executed: its writes are held, and its
// reads see them over the Store, until commit applies them all with one
// KeyStore.Apply.
type overlay struct {
	d       direct
	now     time.Time
	pending map[string]Write // the last write of each key written
	writes  []Write
}

func newOverlay(d direct) *overlay {
	return &overlay{d: d, now: time.Now(), pending: map[string]Write{}}
}

// commit applies the transaction's writes: all of them, or none and an
// error.
func (o *overlay) commit() error {
	if len(o.writes) == 0 {
		return nil
	}
	return o.d.apply(o.writes)
}

func (o *overlay) record(w Write) {
	if !w.Delete && !w.ExpireAt.IsZero() && !w.ExpireAt.After(o.now) {
		w = Write{Key: w.Key, Delete: true}
	}
	o.writes = append(o.writes, w)
	o.pending[w.Key] = w
}

// held returns the transaction's last write of key, if it wrote it, and
// whether that leaves key present.
func (o *overlay) held(key string) (w Write, written, present bool) {
	w, written = o.pending[key]
	return w, written, written && !w.Delete
}

func (o *overlay) notFound(key string) error {
	return fmt.Errorf("key %q deleted earlier in the transaction: %w", key, ErrNotFound)
}

func (o *overlay) view(key string) ([]byte, func(), error) {
	w, written, present := o.held(key)
	switch {
	case present:
		return w.Value, nil, nil
	case written:
		return nil, nil, o.notFound(key)
	}
	return o.d.view(key)
}

func (o *overlay) exists(key string) (bool, error) {
	if _, written, present := o.held(key); written {
		return present, nil
	}
	return o.d.exists(key)
}

func (o *overlay) stat(key string) (KeyInfo, error) {
	w, written, present := o.held(key)
	switch {
	case present:
		n := int64(len(w.Value))
		return KeyInfo{Size: n, Footprint: int64(len(key)) + n, ExpireAt: w.ExpireAt}, nil
	case written:
		return KeyInfo{}, o.notFound(key)
	}
	return o.d.stat(key)
}

func (o *overlay) setWith(key string, value []byte, opts SetOptions) (bool, error) {
	at := opts.ExpireAt
	if opts.Cond != SetAlways || opts.KeepTTL {
		info, err := o.stat(key)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return false, err
		}
		present := err == nil
		if opts.Cond == SetIfAbsent && present || opts.Cond == SetIfPresent && !present {
			return false, nil
		}
		if opts.KeepTTL {
			at = info.ExpireAt
		}
	}
	o.record(Write{Key: key, Value: value, ExpireAt: at})
	return true, nil
}

func (o *overlay) del(key string) (bool, error) {
	ok, err := o.exists(key)
	if ok {
		o.record(Write{Key: key, Delete: true})
	}
	return ok, err
}

// expire rewrites key with its new deadline: a Write carries the value,
// so a key the transaction has not written is read first.
func (o *overlay) expire(key string, at time.Time) (time.Time, error) {
	info, err := o.stat(key)
	if err != nil {
		return time.Time{}, err
	}
	w, _, present := o.held(key)
	if !present {
		v, release, err := o.d.view(key)
		if err != nil {
			return time.Time{}, err
		}
		w = Write{Key: key, Value: append([]byte(nil), v...)}
		if release != nil {
			release()
		}
	}
	w.ExpireAt = at
	o.record(w)
	return info.ExpireAt, nil
}

func (o *overlay) apply(ws []Write) error {
	for _, w := range ws {
		o.record(w)
	}
	return nil
}
