package registry

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// File is a schema file: <subject>.avsc (Avro), <subject>.json (JSON
// Schema) or <subject>.proto (Protobuf), as `relay schema check` and
// `register` read them.
type File struct {
	Subject string
	Path    string
	Type    string
	Text    string
	Schema  Schema
}

// FileType is the schema type a file name's extension says; ok is false
// for files that are not schemas.
func FileType(name string) (typ string, ok bool) {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".avsc":
		return TypeAvro, true
	case ".json":
		return TypeJSON, true
	case ".proto":
		return TypeProtobuf, true
	}
	return "", false
}

// LoadDir reads and parses every schema file directly in dir, sorted by
// subject. A file that does not parse is an error naming it.
func LoadDir(dir string) ([]File, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []File
	seen := map[string]string{}
	for _, e := range entries {
		if e.IsDir() {
			continue
		}
		name := e.Name()
		typ, ok := FileType(name)
		if !ok {
			continue
		}
		path := filepath.Join(dir, name)
		text, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		subject := strings.TrimSuffix(name, filepath.Ext(name))
		if other, dup := seen[subject]; dup {
			return nil, fmt.Errorf("%s and %s are both schemas of subject %q", other, path, subject)
		}
		seen[subject] = path
		sch, err := Parse(typ, string(text))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, File{Subject: subject, Path: path, Type: typ, Text: string(text), Schema: sch})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Subject < out[j].Subject })
	return out, nil
}

// Earlier returns a subject's registered versions as Check takes them,
// oldest first, and whether one of them is f's schema already.
func (s *Store) Earlier(ctx context.Context, subject string, f Schema) (earlier []Checked, registered *Version, err error) {
	hist, err := s.history(ctx, s.db, subject, false)
	if err != nil {
		return nil, nil, err
	}
	checked, err := parseChecked(hist)
	if err != nil {
		return nil, nil, err
	}
	for i, c := range checked {
		if c.Schema.Type() == f.Type() && c.Schema.Fingerprint() == f.Fingerprint() {
			registered = &hist[i]
		}
	}
	return checked, registered, nil
}
