package broker

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// File is the subset of *os.File the log uses. Keeping it small lets tests
// and fault-injection wrappers stand in for the disk.
type File interface {
	io.ReaderAt
	io.Writer
	Sync() error
	Truncate(size int64) error
	Stat() (os.FileInfo, error)
	Close() error
}

// FS is the file system the broker writes through. The default is the
// operating system's; a wrapper can inject write and fsync failures (a full
// disk) to test that nothing unsynced is ever acknowledged.
type FS interface {
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	Remove(name string) error
	Rename(oldpath, newpath string) error
	MkdirAll(path string, perm os.FileMode) error
	ReadDir(name string) ([]os.DirEntry, error)
	// Stat describes the file at name.
	Stat(name string) (os.FileInfo, error)
	// SyncDir makes renames, creations and removals in dir durable.
	SyncDir(dir string) error
}

// OSFS is the operating system's file system.
type OSFS struct{}

// OpenFile opens a file (see openFile).
func (OSFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := openFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// openFile is os.OpenFile in two system calls rather than six. os.OpenFile
// offers every descriptor to the network poller: on Linux it sets the file
// non-blocking, fails to register a regular file with epoll, and sets it
// blocking again, four fcntl calls and an epoll_ctl per open. With
// thousands of partitions, each opening its directory, active segment and
// recovery point, they were most of the broker's open. os.NewFile on a
// blocking descriptor reads its flags once (O_APPEND among them, so that
// WriteAt still refuses an append-only file) and does not poll it. Errors
// are *os.PathError, as os.OpenFile's.
func openFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	for {
		fd, err := unix.Open(name, flag|unix.O_CLOEXEC, uint32(perm.Perm()))
		if err == nil {
			return os.NewFile(uintptr(fd), name), nil
		}
		if err != unix.EINTR {
			return nil, &os.PathError{Op: "open", Path: name, Err: err}
		}
	}
}

// Stat describes a file, as os.Stat.
func (OSFS) Stat(name string) (os.FileInfo, error) { return os.Stat(name) }

// Remove removes a file.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// Rename renames a file, replacing the target atomically on POSIX systems.
func (OSFS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }

// MkdirAll creates a directory and its parents.
func (OSFS) MkdirAll(path string, perm os.FileMode) error { return os.MkdirAll(path, perm) }

// ReadDir lists a directory sorted by name, as os.ReadDir, opening it
// with openFile.
func (OSFS) ReadDir(name string) ([]os.DirEntry, error) {
	d, err := openFile(name, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	entries, err := d.ReadDir(-1)
	_ = d.Close()
	slices.SortFunc(entries, func(a, b os.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries, err
}

// SyncDir fsyncs a directory.
func (OSFS) SyncDir(dir string) error {
	d, err := openFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeFileAtomic is WriteFileAtomic for the broker's own files (0644).
func writeFileAtomic(fsys FS, path string, data []byte) error {
	return WriteFileAtomic(fsys, path, data, 0o644)
}

// WriteFileAtomic replaces path with data: write path+".tmp" (created with
// perm), fsync it, rename it over path, fsync the directory. A crash leaves
// either the old or the new content, never a mix (a leftover ".tmp" file
// at most). It is the one atomic file writer of the repository: the
// broker's metadata and state files, and the Kafka listener's users and
// ACL files, all go through it and so through the FS a test injects faults
// into.
func WriteFileAtomic(fsys FS, path string, data []byte, perm os.FileMode) error {
	tmp := path + ".tmp"
	f, err := fsys.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, perm)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		_ = fsys.Remove(tmp)
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		_ = fsys.Remove(tmp)
		return fmt.Errorf("fsync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		_ = fsys.Remove(tmp)
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := fsys.Rename(tmp, path); err != nil {
		_ = fsys.Remove(tmp)
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	if err := fsys.SyncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("fsync dir of %s: %w", path, err)
	}
	return nil
}

// readFile reads a whole (small, metadata) file through fsys.
func readFile(fsys FS, path string) ([]byte, error) {
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, st.Size())
	n, err := f.ReadAt(buf, 0)
	if err != nil && err != io.EOF {
		return nil, err
	}
	return buf[:n], nil
}
