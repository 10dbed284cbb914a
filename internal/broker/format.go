package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// FormatVersion is the data directory format this broker reads and
// writes, recorded as meta.json's "version". Format 1 is the format of
// v0.1.0, the first release, and of every release since: no change has
// needed a new one yet.
//
// The rule (docs/upgrading.md): a broker opens a directory of its own
// format or an older one. A newer one it opens only when meta.json's
// "compatible_from" says a broker that knows its format may (the newer
// format only adds what older brokers ignore and keep, as an expand
// migration does; this broker's rewrites of meta.json keep both fields),
// and refuses it otherwise with ErrFormatTooNew before it reads or changes
// anything else in it. The first change of format raises FormatVersion,
// sets compatible_from when older brokers may still open the directory,
// and adds, where load reads meta.json, the step that upgrades a directory
// of the previous format in place: the step's changes made durable first,
// then meta.json rewritten with the new version, so that a crash between
// the two repeats the step (which must therefore be idempotent). Since
// v0.1.0 does not check the version, a change must keep the directory
// readable by it while rolling upgrades from it are supported.
const FormatVersion = 1

// ErrFormatTooNew means the data directory was written by a newer relay,
// in a format this one does not know.
var ErrFormatTooNew = errors.New("broker: data directory format is newer than this relay")

// checkFormat refuses a meta.json whose format version this broker cannot
// read: version is its format, compatibleFrom the oldest format a broker
// may know to open it (0: the format itself).
func checkFormat(dir string, version, compatibleFrom int) error {
	switch {
	case version < 1:
		return fmt.Errorf("broker: %s/%s: format version %d is not a valid format (formats start at 1)", dir, metaFile, version)
	case version <= FormatVersion:
		return nil
	case compatibleFrom >= 1 && compatibleFrom <= FormatVersion:
		return nil
	}
	return fmt.Errorf("%w: %s has format %d, this relay reads formats up to %d; run the newer relay that wrote it (or restore the directory from before that relay opened it)",
		ErrFormatTooNew, dir, version, FormatVersion)
}

// CheckFormat reads the format version of the data directory dir without
// opening it (no lock, nothing written) and returns checkFormat's verdict:
// nil for a directory this broker can open or a new one, ErrFormatTooNew
// for one a newer relay wrote in a format this one cannot read. A relay
// calls it at start, so that it refuses such a directory and exits,
// before it takes the leadership and opens the broker (an Open refuses it
// too).
func CheckFormat(dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, metaFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return storageErr("read metadata", err)
	}
	m := metadata{Version: FormatVersion}
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("broker: parse %s: %w", filepath.Join(dir, metaFile), err)
	}
	return checkFormat(dir, m.Version, m.CompatibleFrom)
}
