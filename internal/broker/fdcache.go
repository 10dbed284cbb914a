package broker

import (
	"container/list"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// segmentFilePool bounds, across the broker, the descriptors held open for
// segment files opened for appending (every partition's active segment,
// and a rolled segment until the partition lets it go): Options.MaxOpenFiles.
// Past the bound the least recently used idle file is fsynced and closed,
// and reopened at its next use. See "Open files" in the package doc for its
// fault model.
type segmentFilePool struct {
	fs  FS
	max int

	mu  sync.Mutex
	lru list.List // of *pooledFile with an open descriptor, most recent first
}

// pooledFS opens segment files for appending through pool; everything
// else goes to FS.
type pooledFS struct {
	FS
	pool *segmentFilePool
}

func newPooledFS(fsys FS, max int) FS {
	return pooledFS{FS: fsys, pool: &segmentFilePool{fs: fsys, max: max}}
}

// isSegmentLog reports whether name is a segment file: 20 digits then .log.
func isSegmentLog(name string) bool {
	base, ok := strings.CutSuffix(filepath.Base(name), logSuffix)
	if !ok || len(base) != 20 {
		return false
	}
	return strings.Trim(base, "0123456789") == ""
}

func (p pooledFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	if flag&os.O_APPEND == 0 || !isSegmentLog(name) {
		return p.FS.OpenFile(name, flag, perm)
	}
	p.pool.makeRoom(nil, 1)
	f, err := p.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	info, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	pf := &pooledFile{pool: p.pool, name: name, id: info, f: f}
	p.pool.add(pf)
	return pf, nil
}

// pooledFile is a segment file whose descriptor the pool may close while
// it is idle.
type pooledFile struct {
	pool *segmentFilePool
	name string
	// id is the file as first opened: a reopen that finds another file
	// under the name (compaction renamed one over it) fails rather than
	// read it.
	id os.FileInfo

	// mu serializes the file's use and its eviction.
	mu    sync.Mutex
	f     File // nil while evicted
	elem  *list.Element
	dirty bool // written since its last fsync
	// err is sticky: the fsync before an eviction failed. Every later
	// call returns it, Sync and Close included, so the partition's own
	// next fsync reports it as if it had failed itself.
	err    error
	closed bool
}

var errPooledFileClosed = errors.New("segment file is closed")

// use runs fn on the open descriptor, reopening it when evicted.
func (p *pooledFile) use(fn func(File) error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errPooledFileClosed
	}
	if p.err != nil {
		return p.err
	}
	if p.f == nil {
		p.pool.makeRoom(p, 1)
		f, err := p.pool.fs.OpenFile(p.name, os.O_RDWR|os.O_APPEND, 0)
		if err != nil {
			return fmt.Errorf("reopen segment file: %w", err)
		}
		info, err := f.Stat()
		if err == nil && !os.SameFile(p.id, info) {
			err = fmt.Errorf("segment file %s was replaced while its descriptor was closed", p.name)
		}
		if err != nil {
			_ = f.Close()
			return err
		}
		p.f = f
		p.pool.add(p)
	} else {
		p.pool.touch(p)
	}
	return fn(p.f)
}

func (p *pooledFile) ReadAt(b []byte, off int64) (n int, err error) {
	uerr := p.use(func(f File) error {
		n, err = f.ReadAt(b, off)
		return nil
	})
	if uerr != nil {
		return 0, uerr
	}
	return n, err
}

func (p *pooledFile) Write(b []byte) (n int, err error) {
	uerr := p.use(func(f File) error {
		p.dirty = true
		n, err = f.Write(b)
		return nil
	})
	if uerr != nil {
		return 0, uerr
	}
	return n, err
}

func (p *pooledFile) Truncate(size int64) error {
	return p.use(func(f File) error {
		p.dirty = true
		return f.Truncate(size)
	})
}

func (p *pooledFile) Stat() (info os.FileInfo, err error) {
	err = p.use(func(f File) error {
		info, err = f.Stat()
		return err
	})
	return info, err
}

// Sync fsyncs the open descriptor. An evicted file was fsynced when it was
// closed and not written since, so there is nothing to do; a failed
// eviction fsync is returned.
func (p *pooledFile) Sync() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return errPooledFileClosed
	case p.err != nil:
		return p.err
	case p.f == nil:
		return nil
	}
	if err := p.f.Sync(); err != nil {
		return err
	}
	p.dirty = false
	return nil
}

func (p *pooledFile) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errPooledFileClosed
	}
	p.closed = true
	var err error
	if p.f != nil {
		p.pool.remove(p)
		err = p.f.Close()
		p.f = nil
	}
	return errors.Join(p.err, err)
}

// makeRoom evicts idle files, least recently used first, until room more
// files fit under the bound, sparing except. A file in use (its mutex
// held, as except's is, by a fsync of the interval flusher or a reader) is
// passed over for the next least recently used one, so the bound is
// exceeded only when every open file is in use: never by more than the
// callers running at once, and the next add trims the excess.
func (s *segmentFilePool) makeRoom(except *pooledFile, room int) {
	s.mu.Lock()
	excess := s.lru.Len() - (s.max - room)
	if excess <= 0 {
		s.mu.Unlock()
		return
	}
	// A few more candidates than needed, for those found in use; the
	// pool's whole list only when that many are busy.
	var candidates []*pooledFile
	for e := s.lru.Back(); e != nil && len(candidates) < excess+evictSpare; e = e.Prev() {
		if q := e.Value.(*pooledFile); q != except {
			candidates = append(candidates, q)
		}
	}
	s.mu.Unlock()
	for _, q := range candidates {
		// Concurrent callers evict too: count again rather than evict
		// past the bound.
		s.mu.Lock()
		fits := s.lru.Len() <= s.max-room
		s.mu.Unlock()
		if fits {
			return
		}
		q.evict()
	}
}

// evictSpare is how many files past the excess makeRoom tries when the
// least recently used ones are in use.
const evictSpare = 8

// add puts p, just opened, at the front, and trims what concurrent opens
// left past the bound.
func (s *segmentFilePool) add(p *pooledFile) {
	s.mu.Lock()
	p.elem = s.lru.PushFront(p)
	s.mu.Unlock()
	s.makeRoom(p, 0)
}

func (s *segmentFilePool) touch(p *pooledFile) {
	s.mu.Lock()
	if p.elem != nil {
		s.lru.MoveToFront(p.elem)
	}
	s.mu.Unlock()
}

func (s *segmentFilePool) remove(p *pooledFile) {
	s.mu.Lock()
	if p.elem != nil {
		s.lru.Remove(p.elem)
		p.elem = nil
	}
	s.mu.Unlock()
}

// evict fsyncs and closes p unless it is in use. A failed fsync is kept
// (p.err): after it Linux may have dropped the dirty pages and marked them
// clean, so the descriptor is closed all the same and the error is what
// the file's owner gets from then on.
func (p *pooledFile) evict() {
	if !p.mu.TryLock() {
		return
	}
	defer p.mu.Unlock()
	if p.f == nil || p.closed {
		return
	}
	if p.dirty {
		if err := p.f.Sync(); err != nil {
			p.err = fmt.Errorf("fsync %s before closing its idle descriptor: %w", p.name, err)
		}
	}
	p.pool.remove(p)
	_ = p.f.Close()
	p.f, p.dirty = nil, false
}
