package registry

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/hamba/avro/v2"
)

// avroSchema is an Avro schema parsed by hamba/avro.
type avroSchema struct {
	s avro.Schema
}

func parseAvro(text string) (*avroSchema, error) {
	// A cache per schema: the package-wide default would let two versions
	// of one named record see each other's definitions.
	s, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("invalid Avro schema: %w", err)
	}
	return &avroSchema{s: s}, nil
}

func (a *avroSchema) Type() string { return TypeAvro }

// Fingerprint is of Avro's Parsing Canonical Form, so texts differing only
// in whitespace, order of attributes or docs get the same id.
func (a *avroSchema) Fingerprint() [32]byte {
	return fingerprint(TypeAvro, []byte(a.s.String()))
}

var avroReaders = sync.Pool{New: func() any { return avro.NewReader(nil, 0) }}

// Validate decodes payload as the schema's binary encoding: it must decode
// without error and leave no bytes behind.
func (a *avroSchema) Validate(payload []byte) error {
	r := avroReaders.Get().(*avro.Reader)
	defer avroReaders.Put(r)
	r.Error = nil
	r.Reset(payload)
	var v any
	r.ReadVal(a.s, &v)
	if r.Error != nil {
		return fmt.Errorf("not an Avro encoding of the schema: %w", r.Error)
	}
	if r.Peek(); r.Error == nil {
		return fmt.Errorf("not an Avro encoding of the schema: bytes left over after the value")
	}
	return nil
}

// avroCompatible lists why data written with w cannot be read with r,
// following the Avro specification's schema resolution: fields matched by
// name (or the reader's aliases), a reader field missing from the writer
// needs a default, the numeric promotions, enum symbols, unions branch by
// branch.
func avroCompatible(r, w *avroSchema, newIsReader bool) []Violation {
	c := &avroCheck{violations: violations{newIsReader: newIsReader}, seen: map[[2]*avro.RecordSchema]bool{}}
	c.match("", r.s, w.s)
	return c.out
}

type avroCheck struct {
	violations
	// seen holds the record pairs being compared, to break the
	// recursion of recursive types.
	seen map[[2]*avro.RecordSchema]bool
}

func deref(s avro.Schema) avro.Schema {
	if ref, ok := s.(*avro.RefSchema); ok {
		return ref.Schema()
	}
	return s
}

func describe(s avro.Schema) string {
	s = deref(s)
	switch t := s.(type) {
	case *avro.RecordSchema:
		return "record " + t.FullName()
	case *avro.EnumSchema:
		return "enum " + t.FullName()
	case *avro.FixedSchema:
		return fmt.Sprintf("fixed %s (%d bytes)", t.FullName(), t.Size())
	case *avro.ArraySchema:
		return "array of " + describe(t.Items())
	case *avro.MapSchema:
		return "map of " + describe(t.Values())
	case *avro.UnionSchema:
		var names []string
		for _, b := range t.Types() {
			names = append(names, describe(b))
		}
		return "union [" + strings.Join(names, ", ") + "]"
	}
	return string(s.Type())
}

func promotable(writer, reader avro.Type) bool {
	switch writer {
	case avro.Int:
		return reader == avro.Long || reader == avro.Float || reader == avro.Double
	case avro.Long:
		return reader == avro.Float || reader == avro.Double
	case avro.Float:
		return reader == avro.Double
	case avro.String:
		return reader == avro.Bytes
	case avro.Bytes:
		return reader == avro.String
	}
	return false
}

// fits reports whether w can be read as r, without recording anything.
func (c *avroCheck) fits(r, w avro.Schema) bool {
	sub := &avroCheck{violations: violations{newIsReader: c.newIsReader}, seen: c.seen}
	sub.match("", r, w)
	return len(sub.out) == 0
}

func (c *avroCheck) match(path string, r, w avro.Schema) {
	r, w = deref(r), deref(w)
	if wu, ok := w.(*avro.UnionSchema); ok {
		if ru, ok := r.(*avro.UnionSchema); ok {
			for _, b := range wu.Types() {
				if !c.fitsUnion(ru, b) {
					if c.newIsReader {
						c.add(path, "%s was removed from the union", describe(b))
					} else {
						c.add(path, "%s was added to the union", describe(b))
					}
				}
			}
			return
		}
		for _, b := range wu.Types() {
			if !c.fits(r, b) {
				old, nw := c.oldNew(describe(r), describe(w))
				c.add(path, "type changed from %s to %s, which cannot hold %s", old, nw, describe(b))
				return
			}
		}
		for _, b := range wu.Types() {
			c.match(path, r, b)
		}
		return
	}
	if ru, ok := r.(*avro.UnionSchema); ok {
		if !c.fitsUnion(ru, w) {
			old, nw := c.oldNew(describe(r), describe(w))
			c.add(path, "type changed from %s to %s", old, nw)
		}
		return
	}
	if r.Type() != w.Type() {
		if !promotable(w.Type(), r.Type()) {
			old, nw := c.oldNew(describe(r), describe(w))
			c.add(path, "type changed from %s to %s", old, nw)
		}
		return
	}
	switch rt := r.(type) {
	case *avro.ArraySchema:
		c.match(path+"[]", rt.Items(), w.(*avro.ArraySchema).Items())
	case *avro.MapSchema:
		c.match(path+"{}", rt.Values(), w.(*avro.MapSchema).Values())
	case *avro.FixedSchema:
		wt := w.(*avro.FixedSchema)
		if !c.sameName(path, rt, wt) {
			return
		}
		if rt.Size() != wt.Size() {
			old, nw := c.oldNew(fmt.Sprint(rt.Size()), fmt.Sprint(wt.Size()))
			c.add(path, "fixed %s changed size from %s to %s bytes", rt.FullName(), old, nw)
		}
	case *avro.EnumSchema:
		wt := w.(*avro.EnumSchema)
		if !c.sameName(path, rt, wt) || rt.HasDefault() {
			return
		}
		for _, s := range wt.Symbols() {
			if slices.Contains(rt.Symbols(), s) {
				continue
			}
			if c.newIsReader {
				c.add(path, "enum symbol %q was removed from %s, which has no default symbol", s, rt.FullName())
			} else {
				c.add(path, "enum symbol %q was added to %s, whose old version has no default symbol", s, rt.FullName())
			}
		}
	case *avro.RecordSchema:
		wt := w.(*avro.RecordSchema)
		if !c.sameName(path, rt, wt) {
			return
		}
		key := [2]*avro.RecordSchema{rt, wt}
		if c.seen[key] {
			return
		}
		c.seen[key] = true
		defer delete(c.seen, key)
		for _, rf := range rt.Fields() {
			fp := rf.Name()
			if path != "" {
				fp = path + "." + rf.Name()
			}
			wf := writerField(wt, rf)
			if wf == nil {
				if rf.HasDefault() {
					continue
				}
				if c.newIsReader {
					c.add(fp, "field was added without a default")
				} else {
					c.add(fp, "field was removed, and the old schema has no default for it")
				}
				continue
			}
			c.match(fp, rf.Type(), wf.Type())
		}
	}
}

func (c *avroCheck) fitsUnion(ru *avro.UnionSchema, w avro.Schema) bool {
	for _, b := range ru.Types() {
		if c.fits(b, w) {
			return true
		}
	}
	return false
}

type named interface {
	FullName() string
	Aliases() []string
}

func (c *avroCheck) sameName(path string, r, w named) bool {
	if r.FullName() == w.FullName() || slices.Contains(r.Aliases(), w.FullName()) {
		return true
	}
	old, nw := c.oldNew(r.FullName(), w.FullName())
	c.add(path, "named type renamed from %s to %s without an alias", old, nw)
	return false
}

func writerField(w *avro.RecordSchema, rf *avro.Field) *avro.Field {
	for _, wf := range w.Fields() {
		if wf.Name() == rf.Name() {
			return wf
		}
	}
	for _, wf := range w.Fields() {
		if slices.Contains(rf.Aliases(), wf.Name()) {
			return wf
		}
	}
	return nil
}
