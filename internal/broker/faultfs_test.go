package broker

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// faultOp is a file operation injectFS can fail.
type faultOp int

const (
	opWrite   faultOp = iota // the write fails with err, writing nothing
	opShort                  // half the bytes are written, then err
	opSync                   // fsync fails with err
	opRead                   // ReadAt fails with err
	opSyncDir                // a directory fsync fails with err
)

// faultRule fails the matching operations on files whose base name ends in
// suffix ("" matches all): the first after matching calls pass, then the
// next times calls fail (times < 0: until cleared).
type faultRule struct {
	op     faultOp
	suffix string
	after  int
	times  int
	err    error

	calls, fired int
}

// fileModel is what a crash would leave of one file: the bytes up to
// synced, except the poisoned ranges, which were dirty when an fsync
// failed (Linux may have dropped those pages, and a later fsync does not
// write them) and have not been written again since.
type fileModel struct {
	synced int64
	poison [][2]int64
}

func (m *fileModel) rewrite(from, to int64) {
	var keep [][2]int64
	for _, r := range m.poison {
		if r[1] <= from || r[0] >= to {
			keep = append(keep, r)
			continue
		}
		if r[0] < from {
			keep = append(keep, [2]int64{r[0], from})
		}
		if r[1] > to {
			keep = append(keep, [2]int64{to, r[1]})
		}
	}
	m.poison = keep
}

// injectFS is the operating system's file system with faults injected on
// chosen operations at chosen points, and a model of what survives a
// machine crash (crashCopy).
type injectFS struct {
	OSFS
	mu     sync.Mutex
	rules  []*faultRule
	models map[string]*fileModel
}

func newInjectFS() *injectFS { return &injectFS{models: map[string]*fileModel{}} }

// inject adds a rule and returns it (its fired count says how often it
// failed an operation).
func (f *injectFS) inject(r faultRule) *faultRule {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.err == nil {
		r.err = syscall.EIO
	}
	f.rules = append(f.rules, &r)
	return &r
}

// clear removes every rule: the disk works again.
func (f *injectFS) clear() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = nil
}

func (r *faultRule) firedCount(f *injectFS) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return r.fired
}

// hit says whether op on name fails now, and with what.
func (f *injectFS) hit(op faultOp, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.rules {
		if r.op != op || !strings.HasSuffix(filepath.Base(name), r.suffix) {
			continue
		}
		r.calls++
		if r.calls <= r.after || (r.times >= 0 && r.fired >= r.times) {
			continue
		}
		r.fired++
		return r.err
	}
	return nil
}

func (f *injectFS) model(name string, size int64) *fileModel {
	m := f.models[name]
	if m == nil {
		m = &fileModel{synced: size}
		f.models[name] = m
	}
	return m
}

func (f *injectFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	file, err := f.OSFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	name = filepath.Clean(name)
	size, _ := fileSize(file)
	f.mu.Lock()
	m := f.model(name, size)
	if flag&os.O_TRUNC != 0 {
		m.synced, m.poison = 0, nil
	}
	f.mu.Unlock()
	return &injectFile{File: file, fs: f, name: name}, nil
}

func (f *injectFS) Rename(oldpath, newpath string) error {
	if err := f.OSFS.Rename(oldpath, newpath); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if m, ok := f.models[filepath.Clean(oldpath)]; ok {
		f.models[filepath.Clean(newpath)] = m
		delete(f.models, filepath.Clean(oldpath))
	}
	return nil
}

func (f *injectFS) Remove(name string) error {
	if err := f.OSFS.Remove(name); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.models, filepath.Clean(name))
	return nil
}

func (f *injectFS) SyncDir(dir string) error {
	if err := f.hit(opSyncDir, dir); err != nil {
		return err
	}
	return f.OSFS.SyncDir(dir)
}

// crashCopy copies dir into a new directory as a machine crash would leave
// it: every file the broker wrote through f cut to what its last good
// fsync covered, with poisoned ranges zeroed.
func (f *injectFS) crashCopy(t *testing.T, dir string) string {
	t.Helper()
	out := t.TempDir()
	f.mu.Lock()
	defer f.mu.Unlock()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		dst := filepath.Join(out, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if rel == "LOCK" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if m, ok := f.models[filepath.Clean(path)]; ok {
			if int64(len(data)) > m.synced {
				data = data[:m.synced]
			}
			for _, r := range m.poison {
				for i := r[0]; i < r[1] && i < int64(len(data)); i++ {
					data[i] = 0
				}
			}
		}
		return os.WriteFile(dst, data, 0o644)
	})
	if err != nil {
		t.Fatalf("crash copy: %v", err)
	}
	return out
}

type injectFile struct {
	File
	fs   *injectFS
	name string
}

func (f *injectFile) Write(p []byte) (int, error) {
	if err := f.fs.hit(opWrite, f.name); err != nil {
		return 0, err
	}
	short := f.fs.hit(opShort, f.name)
	if short != nil {
		p = p[:len(p)/2]
	}
	start, _ := fileSize(f.File)
	n, err := f.File.Write(p)
	f.fs.mu.Lock()
	f.fs.model(f.name, start).rewrite(start, start+int64(n))
	f.fs.mu.Unlock()
	if err == nil && short != nil {
		err = short
	}
	return n, err
}

func (f *injectFile) Truncate(size int64) error {
	if err := f.File.Truncate(size); err != nil {
		return err
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	m := f.fs.model(f.name, size)
	m.synced = min(m.synced, size)
	m.rewrite(size, 1<<62)
	return nil
}

func (f *injectFile) Sync() error {
	size, _ := fileSize(f.File)
	if err := f.fs.hit(opSync, f.name); err != nil {
		f.fs.mu.Lock()
		m := f.fs.model(f.name, 0)
		if size > m.synced {
			m.poison = append(m.poison, [2]int64{m.synced, size})
		}
		f.fs.mu.Unlock()
		return err
	}
	if err := f.File.Sync(); err != nil {
		return err
	}
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	m := f.fs.model(f.name, 0)
	m.synced = max(m.synced, size)
	return nil
}

func (f *injectFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.fs.hit(opRead, f.name); err != nil {
		return 0, err
	}
	return f.File.ReadAt(p, off)
}

var _ io.ReaderAt = (*injectFile)(nil)
