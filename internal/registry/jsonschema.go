package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// jsonSchema is a JSON Schema compiled by santhosh-tekuri/jsonschema, plus
// its document for the compatibility check.
type jsonSchema struct {
	doc       any
	compiled  *jsonschema.Schema
	canonical []byte
	// fast is the fast path (jsonfast.go), nil when the schema uses
	// keywords it does not know.
	fast *fastNode
}

const jsonSchemaURL = "mem:///schema.json"

func parseJSONSchema(text string) (*jsonSchema, error) {
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("invalid JSON Schema: not JSON: %w", err)
	}
	c := jsonschema.NewCompiler()
	// Without $schema the document is read as draft 7, the draft the
	// Confluent serializers write.
	c.DefaultDraft(jsonschema.Draft7)
	if err := c.AddResource(jsonSchemaURL, doc); err != nil {
		return nil, fmt.Errorf("invalid JSON Schema: %w", err)
	}
	compiled, err := c.Compile(jsonSchemaURL)
	if err != nil {
		return nil, fmt.Errorf("invalid JSON Schema: %w", err)
	}
	// encoding/json writes object keys sorted: the canonical form.
	canonical, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("invalid JSON Schema: %w", err)
	}
	return &jsonSchema{doc: doc, compiled: compiled, canonical: canonical, fast: compileFast(doc)}, nil
}

func (j *jsonSchema) Type() string { return TypeJSON }

func (j *jsonSchema) Fingerprint() [32]byte { return fingerprint(TypeJSON, j.canonical) }

// libraryOptions match what the validator was given before: a name twice
// keeps the last value, invalid UTF-8 becomes U+FFFD.
var libraryOptions = []jsontext.Options{jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)}

// decodeJSON parses payload, one JSON document with nothing after it,
// into what the validator takes: maps, slices, strings, bools, nil and
// numbers as json.Number, as jsonschema.UnmarshalJSON gives them.
func decodeJSON(payload []byte) (any, error) {
	d := borrowDecoder(payload, libraryOptions...)
	defer d.release()
	v, err := decodeValue(&d.dec)
	if err != nil {
		return nil, err
	}
	if _, err := d.dec.ReadToken(); err != io.EOF {
		if err == nil {
			err = errors.New("data after the document")
		}
		return nil, err
	}
	return v, nil
}

func decodeValue(d *jsontext.Decoder) (any, error) {
	t, err := d.ReadToken()
	if err != nil {
		return nil, err
	}
	switch t.Kind() {
	case 'n':
		return nil, nil
	case 't', 'f':
		return t.Bool(), nil
	case '"':
		return t.String(), nil
	case '0':
		return json.Number(t.String()), nil
	case '{':
		m := map[string]any{}
		for d.PeekKind() != '}' {
			name, err := d.ReadToken()
			if err != nil {
				return nil, err
			}
			key := name.String()
			if m[key], err = decodeValue(d); err != nil {
				return nil, err
			}
		}
		_, err := d.ReadToken()
		return m, err
	case '[':
		a := []any{}
		for d.PeekKind() != ']' {
			v, err := decodeValue(d)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := d.ReadToken()
		return a, err
	}
	return nil, fmt.Errorf("unexpected %v", t.Kind())
}

// Validate parses payload as one JSON document and validates it.
func (j *jsonSchema) Validate(payload []byte) error {
	if j.fast != nil && j.fast.accepts(payload) {
		return nil
	}
	v, err := decodeJSON(payload)
	if err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	if err := j.compiled.Validate(v); err != nil {
		return fmt.Errorf("does not match the JSON Schema: %s", oneLine(err.Error()))
	}
	return nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// jsonCompatible lists why a document valid under w may be invalid under
// r. It compares the keywords that carry a contract: type, properties,
// required, additionalProperties (as a boolean or a schema), enum and
// items, following local $refs. Two assumptions make it usable: a property
// the reader declares and the writer does not is compatible (writers do
// not put undeclared properties in documents, even under an open schema),
// and constraints on values (minimum, pattern, format, ...) are not
// compared.
func jsonCompatible(r, w *jsonSchema, newIsReader bool) []Violation {
	c := &jsonCheck{violations: violations{newIsReader: newIsReader}, rootR: r.doc, rootW: w.doc}
	c.match("", r.doc, w.doc, 0)
	return c.out
}

type jsonCheck struct {
	violations
	rootR, rootW any
}

// resolve follows a local $ref ("#/definitions/x", "#/$defs/x").
func resolve(root, s any) any {
	for range 32 {
		m, ok := s.(map[string]any)
		if !ok {
			return s
		}
		ref, ok := m["$ref"].(string)
		if !ok || !strings.HasPrefix(ref, "#") {
			return s
		}
		target := root
		for _, tok := range strings.Split(strings.TrimPrefix(ref, "#"), "/")[1:] {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			tm, ok := target.(map[string]any)
			if !ok {
				return s
			}
			target = tm[tok]
		}
		s = target
	}
	return s
}

func types(s map[string]any) []string {
	switch t := s["type"].(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, x := range t {
			if str, ok := x.(string); ok {
				out = append(out, str)
			}
		}
		sort.Strings(out)
		return out
	}
	return nil
}

func typeList(ts []string) string {
	if ts == nil {
		return "any type"
	}
	return strings.Join(ts, " or ")
}

func closed(s map[string]any) bool {
	b, ok := s["additionalProperties"].(bool)
	return ok && !b
}

func stringSet(v any) map[string]bool {
	out := map[string]bool{}
	if xs, ok := v.([]any); ok {
		for _, x := range xs {
			if s, ok := x.(string); ok {
				out[s] = true
			}
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func (c *jsonCheck) match(path string, r, w any, depth int) {
	if depth > 64 {
		return
	}
	r, w = resolve(c.rootR, r), resolve(c.rootW, w)
	if rb, ok := r.(bool); ok {
		if !rb {
			if wb, ok := w.(bool); !ok || wb {
				old, nw := c.oldNew("rejects every value", "accepts values")
				c.add(path, "the schema changed from one that %s to one that %s", nw, old)
			}
		}
		return
	}
	rm, ok := r.(map[string]any)
	if !ok {
		return
	}
	wm, ok := w.(map[string]any)
	if !ok {
		if wb, _ := w.(bool); wb && len(rm) > 0 {
			old, nw := c.oldNew("constrained values", "any value")
			c.add(path, "the schema changed from %s to %s", nw, old)
		}
		return
	}
	rt, wt := types(rm), types(wm)
	if rt != nil {
		ok := wt != nil
		for _, t := range wt {
			if !slices.Contains(rt, t) && !(t == "integer" && slices.Contains(rt, "number")) {
				ok = false
			}
		}
		if !ok {
			old, nw := c.oldNew(typeList(rt), typeList(wt))
			c.add(path, "type changed from %s to %s", old, nw)
			return
		}
	}
	if re, ok := rm["enum"].([]any); ok {
		we, _ := wm["enum"].([]any)
		if we == nil {
			if c.newIsReader {
				c.add(path, "values were restricted to an enum")
			} else {
				c.add(path, "the enum was removed, and the old schema allows only its values")
			}
		}
		for _, v := range we {
			if !slices.ContainsFunc(re, func(x any) bool { return reflect.DeepEqual(x, v) }) {
				if c.newIsReader {
					c.add(path, "enum value %v was removed", v)
				} else {
					c.add(path, "enum value %v was added, which the old schema does not allow", v)
				}
			}
		}
	}
	rp, _ := rm["properties"].(map[string]any)
	wp, _ := wm["properties"].(map[string]any)
	if closed(rm) && !closed(wm) {
		if c.newIsReader {
			c.add(path, "additional properties are no longer allowed")
		} else {
			c.add(path, "additional properties are now allowed, which the old schema forbids")
		}
	}
	for _, p := range sortedKeys(wp) {
		if rs, ok := rp[p]; ok {
			c.match(join(path, p), rs, wp[p], depth+1)
			continue
		}
		if closed(rm) {
			if c.newIsReader {
				c.add(join(path, p), "property was removed, and additional properties are not allowed")
			} else {
				c.add(join(path, p), "property was added, and the old schema does not allow additional properties")
			}
		} else if add, ok := rm["additionalProperties"].(map[string]any); ok {
			c.match(join(path, p), add, wp[p], depth+1)
		}
	}
	rreq, wreq := stringSet(rm["required"]), stringSet(wm["required"])
	for _, p := range sortedKeys(rreq) {
		if wreq[p] {
			continue
		}
		_, declared := wp[p]
		switch {
		case c.newIsReader && declared:
			c.add(join(path, p), "property became required")
		case c.newIsReader:
			c.add(join(path, p), "property was added as required")
		case declared:
			c.add(join(path, p), "property is no longer required, but the old schema requires it")
		default:
			c.add(join(path, p), "property was removed, but the old schema requires it")
		}
	}
	if ri, ok := rm["items"]; ok {
		if wi, ok := wm["items"]; ok {
			c.match(path+"[]", ri, wi, depth+1)
		} else if _, isObj := ri.(map[string]any); isObj {
			if c.newIsReader {
				c.add(path+"[]", "array items were constrained")
			} else {
				c.add(path+"[]", "the constraint on array items was removed")
			}
		}
	}
}
