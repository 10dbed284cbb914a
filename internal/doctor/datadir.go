package doctor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// lockFile is the file in the data directory the embedded broker holds a
// flock on while it owns the directory (internal/broker).
const lockFile = "LOCK"

// Free-space thresholds of the data directory's file system.
const (
	failFreeBytes = 256 << 20
	warnFreeBytes = 2 << 30
)

// existingAncestor is dir itself or its nearest existing ancestor, and
// whether that is dir.
func existingAncestor(dir string) (string, bool, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", false, err
	}
	for p := abs; ; p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			return p, p == abs, nil
		} else if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return p, false, err
		}
		if p == filepath.Dir(p) {
			return p, false, fmt.Errorf("no part of %s exists", abs)
		}
	}
}

// DataDir checks that the embedded broker's data directory exists and is
// writable, or can be created.
func (d *Doctor) DataDir(context.Context) Result {
	dir := d.cfg.DataDir
	fixPerm := "give the relay's user write access to " + dir + ", or choose another --data-dir"
	at, exists, err := existingAncestor(dir)
	if err != nil {
		return fail(fixPerm, "data directory %s: %v", dir, err)
	}
	if fi, err := os.Stat(at); err == nil && !fi.IsDir() {
		return fail("choose another --data-dir", "%s is not a directory", at)
	}
	probe, err := os.CreateTemp(at, ".relay-doctor-*")
	if err != nil {
		if exists {
			return fail(fixPerm, "data directory %s is not writable: %v", dir, err)
		}
		return fail(fixPerm, "data directory %s is missing and cannot be created in %s: %v", dir, at, err)
	}
	probe.Close()
	os.Remove(probe.Name())
	if !exists {
		return pass("data directory %s is missing; the relay creates it in %s", dir, at)
	}
	return pass("data directory %s is writable", dir)
}

// DiskSpace checks the free space of the data directory's file system:
// below 256 MiB fails, below 2 GiB warns.
func (d *Doctor) DiskSpace(context.Context) Result {
	at, _, err := existingAncestor(d.cfg.DataDir)
	if err != nil {
		return Result{Status: Skip, Detail: "the data directory cannot be located (see the data-dir check)"}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(at, &st); err != nil {
		return fail("check the data directory's file system", "reading the free space of %s: %v", at, err)
	}
	free := st.Bavail * uint64(st.Bsize)
	msg := fmt.Sprintf("%s free on the file system of %s", bytesString(free), at)
	fix := "free space on that file system, shorten the topics' retention, or move --data-dir to a larger one"
	switch {
	case free < failFreeBytes:
		return fail(fix, "only %s (under %s the broker may stop accepting events)", msg, bytesString(failFreeBytes))
	case free < warnFreeBytes:
		return warn(fix, "only %s", msg)
	}
	return pass("%s", msg)
}

func bytesString(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	default:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	}
}

// DataDirLock checks that no other process holds the data directory's
// lock, naming the holder's PID when /proc/locks tells it.
func (d *Doctor) DataDirLock(context.Context) Result {
	path := filepath.Join(d.cfg.DataDir, lockFile)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return pass("no process holds the data directory's lock")
	}
	if err != nil {
		return fail("give the relay's user access to "+path, "opening the lock file %s: %v", path, err)
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		return pass("no process holds the data directory's lock")
	}
	if !errors.Is(err, syscall.EWOULDBLOCK) {
		return fail("check the data directory's file system", "locking %s: %v", path, err)
	}
	holder := "another process"
	if fi, err := f.Stat(); err == nil {
		if pid := flockHolder(fi); pid > 0 {
			holder = describePID(pid)
		}
	}
	return fail("stop the other relay that uses this data directory, or give this relay its own --data-dir",
		"the data directory %s is locked: held by %s", d.cfg.DataDir, holder)
}
