package broker

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"
)

// The consumer group offsets (groups.go) and the transaction state (txn.go)
// are each one append-only file of self-checking frames, read whole at
// Open, appended to with an fsync per write, and replaced by a compacted
// copy. These are the file steps the two share; what stands for the file
// in errors and logs ("offsets", "transaction state").

// loadFrameLog reads the file at path (a file not there yet is empty)
// frame by frame: apply parses and applies the frame at the start of b and
// returns its length, or an error for a torn or damaged frame, which ends
// the log. What follows the last good frame is copied aside (path +
// cutInfix + a timestamp) and cut off, so that appends follow it. It
// returns the file opened for appending and its length.
func loadFrameLog(fsys FS, path string, logger *slog.Logger, what string, apply func(b []byte) (int, error)) (File, int64, error) {
	data, err := readFile(fsys, path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, 0, storageErr("read "+what, err)
	}
	pos := 0
	for pos < len(data) {
		n, err := apply(data[pos:])
		if err != nil {
			break
		}
		pos += n
	}
	f, err := fsys.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		return nil, 0, storageErr("open "+what, err)
	}
	if pos < len(data) {
		cut := fmt.Sprintf("%s%s%d", path, cutInfix, time.Now().UnixNano())
		logger.Warn("truncating torn "+what+" tail", "valid_bytes", pos, "cut_bytes", len(data)-pos, "kept_in", cut)
		if err := copyRange(fsys, f, int64(pos), int64(len(data)), cut); err != nil {
			_ = f.Close()
			return nil, 0, storageErr("save cut "+what+" tail", err)
		}
		if err := f.Truncate(int64(pos)); err != nil {
			_ = f.Close()
			return nil, 0, storageErr("truncate "+what, err)
		}
	}
	return f, int64(pos), nil
}

// appendFrames writes buf at the end of f (size bytes long) and fsyncs it;
// a failed write is cut off again. f nil is a closed log (ErrClosed), and
// a broker that lost its storage writes nothing.
func appendFrames(f File, size int64, h *health, buf []byte, what string) error {
	if f == nil {
		return ErrClosed
	}
	if err := h.check(); err != nil {
		return err
	}
	if _, err := f.Write(buf); err != nil {
		_ = f.Truncate(size)
		return storageErr("write "+what, err)
	}
	return h.sync(f, "fsync "+what)
}

// replaceFrameLog replaces the file at path by buf atomically and makes
// *f, the file open (size bytes long), the new one, opened for appending.
// On an error *f is left as it was.
func replaceFrameLog(fsys FS, path string, f *File, size *int64, buf []byte) error {
	if err := writeFileAtomic(fsys, path, buf); err != nil {
		return err
	}
	nf, err := fsys.OpenFile(path, os.O_RDWR|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_ = (*f).Close()
	*f, *size = nf, int64(len(buf))
	return nil
}

// closeFrameLog closes *f, if it is open, and marks it closed (nil).
func closeFrameLog(f *File) error {
	if *f == nil {
		return nil
	}
	err := (*f).Close()
	*f = nil
	return err
}
