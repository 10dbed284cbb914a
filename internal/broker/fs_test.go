package broker

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestOSFSOpensAsOSDoes checks that OSFS's two-call open behaves as
// os.OpenFile where the broker relies on it: errors are *os.PathError that
// errors.Is recognises, an O_APPEND file appends and refuses WriteAt, the
// descriptor is closed on exec and blocking, and ReadDir sorts by name.
func TestOSFSOpensAsOSDoes(t *testing.T) {
	dir := t.TempDir()
	var fsys OSFS
	_, err := fsys.OpenFile(filepath.Join(dir, "missing"), os.O_RDONLY, 0)
	var pe *os.PathError
	if !errors.As(err, &pe) || pe.Op != "open" || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("opening a missing file: %v (%T), want an *os.PathError for open that is fs.ErrNotExist", err, err)
	}
	name := filepath.Join(dir, "00000000000000000000.log")
	f, err := fsys.OpenFile(name, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, s := range []string{"ab", "cd"} {
		if _, err := f.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.(*os.File).WriteAt([]byte("x"), 0); err == nil {
		t.Error("WriteAt on a file opened with O_APPEND succeeded, want os's refusal")
	}
	if b, err := os.ReadFile(name); err != nil || string(b) != "abcd" {
		t.Errorf("file holds %q (%v), want the appends %q", b, err, "abcd")
	}
	if st, err := os.Stat(name); err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("file mode %v (%v), want 0640", st.Mode().Perm(), err)
	}
	fd := int(f.(*os.File).Fd())
	if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("descriptor flags %#x (%v), want FD_CLOEXEC", flags, err)
	}
	if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err != nil || flags&unix.O_NONBLOCK != 0 {
		t.Errorf("file status flags %#x (%v), want blocking", flags, err)
	}

	for _, n := range []string{"b", "c", "a"} {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	entries, err := fsys.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"00000000000000000000.log", "a", "b", "c"}; !slices.Equal(names, want) {
		t.Errorf("ReadDir listed %v, want %v", names, want)
	}
	if _, err := fsys.ReadDir(name); err == nil {
		t.Error("ReadDir of a regular file succeeded")
	}
	if err := fsys.SyncDir(dir); err != nil {
		t.Errorf("SyncDir: %v", err)
	}
}
