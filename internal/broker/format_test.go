package broker

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readMetaVersion reads meta.json's format version from dir.
func readMetaVersion(t *testing.T, dir string) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	if m.Version == nil {
		t.Fatalf("meta.json records no format version:\n%s", data)
	}
	return *m.Version
}

// setMetaVersion rewrites meta.json's format version in dir.
func setMetaVersion(t *testing.T, dir string, version int) {
	t.Helper()
	setMetaField(t, dir, "version", version)
}

// setMetaField rewrites one field of meta.json in dir.
func setMetaField(t *testing.T, dir, field string, value int) {
	t.Helper()
	path := filepath.Join(dir, metaFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m[field] = value
	if data, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestFormatVersion: a new data directory records FormatVersion; one whose
// meta.json names a newer format is refused with ErrFormatTooNew, naming
// both formats, and left as it was (the broker writes nothing and opens no
// partition); a newer format whose compatible_from is this broker's format
// opens, and keeps both fields through this broker's rewrites; an invalid
// version is refused; the directory opens again once its version is one
// this broker reads.
func TestFormatVersion(t *testing.T) {
	dir := t.TempDir()
	b := openWithTopic(t, dir, nil, "orders", TopicConfig{Partitions: 2})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readMetaVersion(t, dir); got != FormatVersion {
		t.Fatalf("meta.json format version %d, want %d", got, FormatVersion)
	}

	setMetaVersion(t, dir, FormatVersion+1)
	before, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(context.Background(), Options{Dir: dir, JanitorInterval: -1, Logger: quietLogger()})
	if !errors.Is(err, ErrFormatTooNew) {
		t.Fatalf("Open of a newer format = %v, want ErrFormatTooNew", err)
	}
	for _, want := range []string{"format 2", "formats up to 1", dir} {
		if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("error %q: want one line naming %q", err, want)
		}
	}
	after, err := os.ReadFile(filepath.Join(dir, metaFile))
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Fatalf("a refused open rewrote meta.json:\n%s\nbecame\n%s", before, after)
	}

	// A newer format that says this broker may open it is opened, and
	// meta.json keeps both fields through this broker's rewrites.
	setMetaField(t, dir, "compatible_from", FormatVersion)
	if err := CheckFormat(dir); err != nil {
		t.Fatalf("CheckFormat of a newer format compatible with this one = %v", err)
	}
	b = openTest(t, dir, nil)
	if _, err := b.CreateTopic("more", TopicConfig{Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readMetaVersion(t, dir); got != FormatVersion+1 {
		t.Fatalf("meta.json format version %d after this broker rewrote it, want %d", got, FormatVersion+1)
	}
	if err := CheckFormat(dir); err != nil {
		t.Fatalf("compatible_from lost by this broker's rewrite: %v", err)
	}
	setMetaField(t, dir, "compatible_from", FormatVersion+1)
	if err := CheckFormat(dir); !errors.Is(err, ErrFormatTooNew) {
		t.Fatalf("CheckFormat of a newer format compatible only with itself = %v, want ErrFormatTooNew", err)
	}

	setMetaVersion(t, dir, 0)
	if _, err := Open(context.Background(), Options{Dir: dir, JanitorInterval: -1, Logger: quietLogger()}); err == nil || errors.Is(err, ErrFormatTooNew) {
		t.Fatalf("Open of format 0 = %v, want an invalid-format error", err)
	}

	setMetaVersion(t, dir, FormatVersion)
	b = openTest(t, dir, nil)
	if info, err := b.Topic("orders"); err != nil || len(info.Partitions) != 2 {
		t.Fatalf("after the refusals: topic orders = %+v, %v", info, err)
	}
}

// TestCheckFormat: CheckFormat, which reads meta.json without opening the
// directory, accepts a new directory and one of this format, and refuses
// a newer format as Open does.
func TestCheckFormat(t *testing.T) {
	dir := t.TempDir()
	if err := CheckFormat(filepath.Join(dir, "absent")); err != nil {
		t.Fatalf("CheckFormat of a new directory = %v", err)
	}
	b := openTest(t, dir, nil)
	if err := CheckFormat(dir); err != nil {
		t.Fatalf("CheckFormat of an open directory of this format = %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	setMetaVersion(t, dir, FormatVersion+1)
	if err := CheckFormat(dir); !errors.Is(err, ErrFormatTooNew) {
		t.Fatalf("CheckFormat of a newer format = %v, want ErrFormatTooNew", err)
	}
}
