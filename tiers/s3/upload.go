package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvstrata/kvstrata/tiers"
)

// maxUploadBackoff bounds the wait before a failed upload is tried again
// while the store is available.
const maxUploadBackoff = 5 * time.Second

// uploadLoop seals the open segments older than FlushInterval and starts
// the uploads of sealed segments, Concurrency at a time, whenever a
// segment is sealed, an upload ends, the store comes back, or a quarter of
// FlushInterval has passed. It never drops a segment: one that fails is
// tried again, after a backoff while the store is available and at once
// when it comes back.
func (t *Tier) uploadLoop() {
	defer t.wg.Done()
	tick := time.NewTicker(max(t.cfg.FlushInterval/4, 5*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-t.uploadWake:
		case <-tick.C:
		}
		t.mu.Lock()
		t.sealExpiredLocked(time.Now(), false)
		t.mu.Unlock()
		if t.avail.err() == nil {
			t.startUploads()
		}
	}
}

func (t *Tier) wakeUploader() {
	select {
	case t.uploadWake <- struct{}{}:
	default:
	}
}

// retryUploadsNow clears the backoff of every failed upload and wakes the
// uploader; the probe calls it when the store is back.
func (t *Tier) retryUploadsNow() {
	t.mu.Lock()
	for _, seg := range t.sealed {
		seg.retryAt = time.Time{}
	}
	t.mu.Unlock()
	t.wakeUploader()
}

// startUploads starts an upload for each sealed segment that is due, as
// long as upload slots are free.
func (t *Tier) startUploads() {
	for {
		select {
		case t.uploadSlots <- struct{}{}:
		default:
			return
		}
		t.mu.Lock()
		var seg *segment
		var body *segmentReader
		now := time.Now()
		for _, s := range t.sealed {
			if !s.uploading && !now.Before(s.retryAt) {
				seg, body = s, t.claimLocked(s)
				break
			}
		}
		t.mu.Unlock()
		if seg == nil {
			<-t.uploadSlots
			return
		}
		t.wg.Add(1)
		go func() {
			defer t.wg.Done()
			defer func() { <-t.uploadSlots }()
			if err := t.runUpload(t.ctx, seg, body); err != nil && t.ctx.Err() == nil {
				t.cfg.Logger.Warn("s3: segment upload failed; it stays in memory and is tried again",
					"segment", seg.id, "bytes", seg.bytes, "err", err)
			}
			t.wakeUploader() // a slot is free
		}()
	}
}

// claimLocked marks a sealed segment as being uploaded and captures its
// bytes.
func (t *Tier) claimLocked(seg *segment) *segmentReader {
	seg.uploading = true
	seg.done = make(chan struct{})
	return newSegmentReaderLocked(seg)
}

// runUpload uploads a claimed segment and records the outcome.
func (t *Tier) runUpload(ctx context.Context, seg *segment, body *segmentReader) error {
	err := t.uploadSegment(ctx, seg, body)
	t.mu.Lock()
	defer t.mu.Unlock()
	seg.uploading = false
	close(seg.done)
	if err != nil {
		seg.failures++
		seg.retryAt = time.Now().Add(min(t.cfg.RetryBackoff<<min(seg.failures, 16), maxUploadBackoff))
		return fmt.Errorf("s3: upload segment %v: %w", seg.id, err)
	}
	return nil
}

// uploadSegment writes a claimed segment's data object, unless an earlier
// attempt did, then its index object listing the blocks still live, and
// commits. A segment whose blocks were all deleted meanwhile is dropped,
// with its data object if one was written.
func (t *Tier) uploadSegment(ctx context.Context, seg *segment, body *segmentReader) error {
	t.mu.Lock()
	empty := len(seg.members) == 0
	if empty && !seg.dataDone {
		t.dropSealedLocked(seg)
	}
	t.mu.Unlock()
	if empty {
		if seg.dataDone {
			// An index an earlier attempt wrote, unbeknown to it, goes
			// first; then the data.
			for _, name := range []string{t.lay.indexName(seg.id), t.lay.dataName(seg.id)} {
				if err := t.store.remove(ctx, name); err != nil {
					return err
				}
			}
			t.mu.Lock()
			t.dropSealedLocked(seg)
			t.mu.Unlock()
		}
		return nil
	}
	if !seg.dataDone {
		if _, err := t.store.put(ctx, t.lay.dataName(seg.id), body, seg.bytes); err != nil {
			return err
		}
		t.mu.Lock()
		seg.dataDone = true
		t.mu.Unlock()
	}
	t.mu.Lock()
	x, indexed := t.indexLocked(seg)
	seg.indexTried = true
	t.mu.Unlock()
	if len(indexed) == 0 {
		return t.uploadSegment(ctx, seg, body) // all deleted meanwhile: drop it
	}
	enc := encodeIndex(nil, x)
	etag, err := t.store.put(ctx, t.lay.indexName(seg.id), bytes.NewReader(enc), int64(len(enc)))
	if err != nil {
		return err
	}
	t.mu.Lock()
	t.commitLocked(seg, indexed, etag, int64(len(enc)))
	queued := len(t.deletes) > 0
	t.mu.Unlock()
	if queued {
		t.wakeDeleter()
	}
	return nil
}

// Flush uploads every segment in memory, the open ones included, and
// applies the pending deletes to their index objects now. It fails fast,
// with an error wrapping tiers.ErrUnavailable, while the store is
// unavailable; segments it could not upload stay in memory and the
// background uploader tries them again.
func (t *Tier) Flush(ctx context.Context) error {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return fmt.Errorf("s3: flush: %w", tiers.ErrClosed)
	}
	if err := t.flush(ctx); err != nil {
		return fmt.Errorf("s3: flush: %w", err)
	}
	return nil
}

func (t *Tier) flush(ctx context.Context) error {
	t.mu.Lock()
	t.sealExpiredLocked(time.Now(), true)
	targets := slices.Clone(t.sealed)
	t.mu.Unlock()

	slots := make(chan struct{}, t.cfg.Concurrency)
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, seg := range targets {
		wg.Go(func() { errs[i] = t.flushSegment(ctx, seg, slots) })
	}
	wg.Wait()
	return errors.Join(errors.Join(errs...), t.applyDeletes(ctx))
}

// flushSegment waits for a background upload of seg in flight, if any,
// and uploads seg itself when it is not stored by then.
func (t *Tier) flushSegment(ctx context.Context, seg *segment, slots chan struct{}) error {
	for {
		t.mu.Lock()
		state, uploading, done := seg.state, seg.uploading, seg.done
		if state != segSealed {
			t.mu.Unlock()
			return nil
		}
		if uploading {
			t.mu.Unlock()
			select {
			case <-done:
				continue
			case <-ctx.Done():
				return fmt.Errorf("segment %v: %w", seg.id, ctx.Err())
			}
		}
		body := t.claimLocked(seg)
		t.mu.Unlock()
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			err := ctx.Err()
			t.mu.Lock()
			seg.uploading = false
			close(seg.done)
			t.mu.Unlock()
			return fmt.Errorf("segment %v: %w", seg.id, err)
		}
		err := t.runUpload(ctx, seg, body)
		<-slots
		return err
	}
}
