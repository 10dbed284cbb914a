package registry

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"sync"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
)

// The JSON Schema fast path. Validating with the library means decoding
// each payload into maps and comparing every number as a big.Rat: about
// three times the relay's own cost per event. Most event schemas use a
// small set of keywords, which can be checked in one pass over the
// payload's tokens without building it. A schema made only of those
// keywords (and of a draft from 6 on) gets a fastNode tree; a payload the
// fast path accepts is valid, and one it does not accept (or a number it
// will not judge, anything odd) goes to the library,
// whose verdict and error message stand. So the fast path must never
// accept what the library rejects; TestJSONFastPathAgrees checks that on
// generated payloads. Both read payloads with jsontext (the upstream of
// encoding/json/v2), from a pooled decoder: the fast path allocates nothing.

type jsonType uint8

const (
	tNull jsonType = 1 << iota
	tBool
	tInteger
	tNumber
	tString
	tArray
	tObject
)

var jsonTypeNames = map[string]jsonType{"null": tNull, "boolean": tBool, "integer": tInteger, "number": tNumber | tInteger,
	"string": tString, "array": tArray, "object": tObject}

type fastNode struct {
	// types allowed; 0 is any.
	types    jsonType
	props    map[string]*fastNode
	required map[string]int
	closed   bool
	addl     *fastNode
	items    *fastNode
	// enum holds the allowed values' canonical forms (see literal);
	// nil is no enum.
	enum                 map[string]bool
	minimum, maximum     *int64
	minLength, maxLength int
}

// fastKeywords are the keywords compileFast understands; annotations
// that do not constrain are among them.
var fastKeywords = map[string]bool{"$schema": true, "$id": true, "$comment": true, "title": true, "description": true, "default": true,
	"examples": true, "deprecated": true, "readOnly": true, "writeOnly": true, "type": true, "properties": true, "required": true,
	"additionalProperties": true, "items": true, "enum": true, "minimum": true, "maximum": true, "minLength": true, "maxLength": true}

// fastDrafts are the $schema values whose rules the fast path follows
// (from draft 6 on, 1.0 is an integer); no $schema reads as draft 7.
var fastDrafts = map[string]bool{"": true, "http://json-schema.org/draft-06/schema#": true, "http://json-schema.org/draft-07/schema#": true,
	"http://json-schema.org/draft-06/schema": true, "http://json-schema.org/draft-07/schema": true,
	"https://json-schema.org/draft/2019-09/schema": true, "https://json-schema.org/draft/2020-12/schema": true}

// compileFast returns the fast path for a schema document, or nil when it
// uses anything else.
func compileFast(doc any) *fastNode {
	root, ok := doc.(map[string]any)
	if !ok {
		return nil
	}
	draft, _ := root["$schema"].(string)
	if _, has := root["$schema"]; has && !fastDrafts[draft] {
		return nil
	}
	n, ok := compileNode(doc, true)
	if !ok {
		return nil
	}
	return n
}

func compileNode(s any, root bool) (*fastNode, bool) {
	if b, ok := s.(bool); ok {
		if b {
			return &fastNode{minLength: -1, maxLength: -1}, true
		}
		return nil, false
	}
	m, ok := s.(map[string]any)
	if !ok {
		return nil, false
	}
	n := &fastNode{minLength: -1, maxLength: -1}
	for k, v := range m {
		if !fastKeywords[k] || (!root && (k == "$schema" || k == "$id")) {
			return nil, false
		}
		switch k {
		case "type":
			switch t := v.(type) {
			case string:
				if n.types = jsonTypeNames[t]; n.types == 0 {
					return nil, false
				}
			case []any:
				for _, x := range t {
					name, _ := x.(string)
					if jsonTypeNames[name] == 0 {
						return nil, false
					}
					n.types |= jsonTypeNames[name]
				}
			default:
				return nil, false
			}
		case "properties":
			props, ok := v.(map[string]any)
			if !ok {
				return nil, false
			}
			n.props = map[string]*fastNode{}
			for name, ps := range props {
				if n.props[name], ok = compileNode(ps, false); !ok {
					return nil, false
				}
			}
		case "required":
			req, ok := v.([]any)
			if !ok {
				return nil, false
			}
			n.required = map[string]int{}
			for _, x := range req {
				name, ok := x.(string)
				if !ok {
					return nil, false
				}
				if _, dup := n.required[name]; !dup {
					n.required[name] = len(n.required)
				}
			}
			if len(n.required) > 64 {
				return nil, false
			}
		case "additionalProperties":
			if b, isBool := v.(bool); isBool && !b {
				n.closed = true
			} else if n.addl, ok = compileNode(v, false); !ok {
				return nil, false
			}
		case "items":
			if n.items, ok = compileNode(v, false); !ok {
				return nil, false
			}
		case "enum":
			xs, ok := v.([]any)
			if !ok {
				return nil, false
			}
			n.enum = map[string]bool{}
			for _, x := range xs {
				lit, ok := literalOf(x)
				if !ok {
					return nil, false
				}
				n.enum[lit] = true
			}
		case "minimum", "maximum":
			num, ok := v.(json.Number)
			if !ok {
				return nil, false
			}
			i, err := strconv.ParseInt(string(num), 10, 64)
			if err != nil {
				return nil, false
			}
			if k == "minimum" {
				n.minimum = &i
			} else {
				n.maximum = &i
			}
		case "minLength", "maxLength":
			num, ok := v.(json.Number)
			if !ok {
				return nil, false
			}
			i, err := strconv.Atoi(string(num))
			if err != nil || i < 0 {
				return nil, false
			}
			if k == "minLength" {
				n.minLength = i
			} else {
				n.maxLength = i
			}
		}
	}
	return n, true
}

// literalOf is a scalar enum value's canonical form; numbers only as
// plain integers.
func literalOf(x any) (string, bool) {
	switch v := x.(type) {
	case nil:
		return "null", true
	case bool:
		return strconv.FormatBool(v), true
	case string:
		return "s" + v, true
	case json.Number:
		if _, err := strconv.ParseInt(string(v), 10, 64); err == nil {
			return "i" + string(v), true
		}
	}
	return "", false
}

// jsonDecoder is a pooled jsontext decoder reading from a copy of one
// payload; scratch holds names and strings that had escapes.
type jsonDecoder struct {
	buf     bytes.Buffer
	dec     jsontext.Decoder
	scratch []byte
}

var jsonDecoders = sync.Pool{New: func() any { return new(jsonDecoder) }}

// borrowDecoder returns a decoder positioned at the start of payload.
func borrowDecoder(payload []byte, opts ...jsontext.Options) *jsonDecoder {
	d := jsonDecoders.Get().(*jsonDecoder)
	d.buf.Reset()
	d.buf.Write(payload)
	d.dec.Reset(&d.buf, opts...)
	return d
}

func (d *jsonDecoder) release() {
	if d.buf.Cap() > 64<<10 {
		return
	}
	d.buf.Reset()
	d.dec.Reset(&d.buf)
	jsonDecoders.Put(d)
}

// fastOptions: a name twice is checked twice (stricter than the library,
// which sees the last one); invalid UTF-8 is an error here, so the library
// judges it.
var fastOptions = jsontext.AllowDuplicateNames(true)

// accepts reports whether the fast path can tell payload is valid.
func (n *fastNode) accepts(payload []byte) bool {
	d := borrowDecoder(payload, fastOptions)
	defer d.release()
	if !n.check(d) {
		return false
	}
	_, err := d.dec.ReadValue()
	return err == io.EOF
}

func (n *fastNode) allows(t jsonType) bool { return n.types == 0 || n.types&t != 0 }

// str reads a string (a value or a name) and returns its contents, valid
// until the next call on d.
func (d *jsonDecoder) str() ([]byte, bool) {
	v, err := d.dec.ReadValue()
	if err != nil || len(v) < 2 || v[0] != '"' {
		return nil, false
	}
	if bytes.IndexByte(v, '\\') < 0 {
		return v[1 : len(v)-1], true
	}
	d.scratch, err = jsontext.AppendUnquote(d.scratch[:0], v)
	return d.scratch, err == nil
}

func (n *fastNode) check(d *jsonDecoder) bool {
	switch d.dec.PeekKind() {
	case '{':
		if !n.allows(tObject) || n.enum != nil {
			return false
		}
		if _, err := d.dec.ReadToken(); err != nil {
			return false
		}
		var seen uint64
		for {
			switch d.dec.PeekKind() {
			case '}':
				if _, err := d.dec.ReadToken(); err != nil {
					return false
				}
				return seen == (uint64(1)<<len(n.required))-1
			case '"':
			default:
				return false
			}
			key, ok := d.str()
			if !ok {
				return false
			}
			// key is only valid until the next read: look it up first.
			if i, req := n.required[string(key)]; req {
				seen |= 1 << i
			}
			child := n.props[string(key)]
			switch {
			case child != nil:
				ok = child.check(d)
			case n.closed:
				ok = false
			case n.addl != nil:
				ok = n.addl.check(d)
			default:
				ok = d.dec.SkipValue() == nil
			}
			if !ok {
				return false
			}
		}
	case '[':
		if !n.allows(tArray) || n.enum != nil {
			return false
		}
		if _, err := d.dec.ReadToken(); err != nil {
			return false
		}
		for {
			switch d.dec.PeekKind() {
			case ']':
				_, err := d.dec.ReadToken()
				return err == nil
			case 0:
				return false
			}
			var ok bool
			if n.items != nil {
				ok = n.items.check(d)
			} else {
				ok = d.dec.SkipValue() == nil
			}
			if !ok {
				return false
			}
		}
	case '"':
		s, ok := d.str()
		if !ok || !n.allows(tString) {
			return false
		}
		if n.minLength >= 0 || n.maxLength >= 0 {
			l := utf8.RuneCount(s)
			if l < n.minLength || (n.maxLength >= 0 && l > n.maxLength) {
				return false
			}
		}
		return n.enum == nil || n.enum["s"+string(s)]
	case '0':
		v, err := d.dec.ReadValue()
		if err != nil || !plainInteger(v) {
			// Fractions, exponents and big integers: the library judges.
			return false
		}
		lit := string(v)
		i, err := strconv.ParseInt(lit, 10, 64)
		if err != nil || !n.allows(tInteger) {
			return false
		}
		if (n.minimum != nil && i < *n.minimum) || (n.maximum != nil && i > *n.maximum) {
			return false
		}
		return n.enum == nil || n.enum["i"+lit]
	case 't', 'f':
		v, err := d.dec.ReadValue()
		if err != nil || !n.allows(tBool) {
			return false
		}
		return n.enum == nil || n.enum[string(v)]
	case 'n':
		_, err := d.dec.ReadValue()
		return err == nil && n.allows(tNull) && (n.enum == nil || n.enum["null"])
	}
	return false
}

// plainInteger: an optional minus, then 0 or digits not starting with 0.
func plainInteger(s []byte) bool {
	if len(s) > 0 && s[0] == '-' {
		s = s[1:]
	}
	if len(s) == 0 || (s[0] == '0' && len(s) > 1) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
