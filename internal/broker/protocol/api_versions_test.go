package protocol

import (
	"fmt"
	"reflect"
	"sort"
	"testing"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestEveryAdvertisedVersionAnswers: for every API and every version
// ApiVersions advertises, a request of that version as a client sends it
// (kmsg's defaults, naming an existing topic and group where the request
// has a place for them) is answered on an open connection, in that
// version's format, with no UNSUPPORTED_VERSION anywhere in it: nothing
// advertised is refused. The per-field behaviour of each version is
// asserted by TestEveryAdvertisedVersionAudited.
func TestEveryAdvertisedVersionAnswers(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	f.createTopic(t, "audit", 1)
	keys := make([]int16, 0, len(supportedVersions))
	for k := range supportedVersions {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	for _, key := range keys {
		r := supportedVersions[key]
		for v := r.min; v <= r.max; v++ {
			req := kmsg.RequestForKey(key)
			if req == nil {
				t.Fatalf("api key %d is advertised but kmsg does not know it", key)
			}
			req.SetVersion(v)
			fill(reflect.ValueOf(req).Elem())
			if p, ok := req.(*kmsg.ProduceRequest); ok {
				p.Acks = -1 // acks 0 is answered by nothing, by design
			}
			name := fmt.Sprintf("%s v%d", kmsg.NameForKey(key), v)
			rc := dialRaw(t, f.addr)
			corr := rc.send(req)
			body, err := rc.readFrame()
			if err != nil {
				t.Errorf("%s: no answer (%v)", name, err)
				continue
			}
			resp := req.ResponseKind()
			rd := kbin.Reader{Src: body}
			if got := rd.Int32(); got != corr {
				t.Errorf("%s: correlation id %d, want %d", name, got, corr)
			}
			if resp.IsFlexible() && key != kmsg.ApiVersions.Int16() {
				kmsg.SkipTags(&rd)
			}
			if err := resp.ReadFrom(rd.Src); err != nil {
				t.Errorf("%s: the answer does not decode at that version: %v", name, err)
				continue
			}
			if path, ok := findCode(reflect.ValueOf(resp).Elem(), kerr.UnsupportedVersion.Code, "resp"); ok {
				t.Errorf("%s: UNSUPPORTED_VERSION at %s", name, path)
			}
			_ = rc.c.Close()
		}
	}
}

// fill names the topic "audit" and the group "audit-group" wherever a
// request has a Topic, Group or GroupID string field left empty, one level
// of slices deep, so that handlers reach their per-topic paths.
func fill(v reflect.Value) {
	for i := range v.NumField() {
		fv, ft := v.Field(i), v.Type().Field(i)
		switch {
		case fv.Kind() == reflect.String && fv.String() == "" && ft.Name == "Topic":
			fv.SetString("audit")
		case fv.Kind() == reflect.String && fv.String() == "" && (ft.Name == "Group" || ft.Name == "GroupID"):
			fv.SetString("audit-group")
		}
	}
}

// findCode looks for an int16 ErrorCode field equal to code anywhere in v
// and returns its path.
func findCode(v reflect.Value, code int16, path string) (string, bool) {
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if f.Name == "ErrorCode" && v.Field(i).Kind() == reflect.Int16 && int16(v.Field(i).Int()) == code {
				return path + "." + f.Name, true
			}
			if p, ok := findCode(v.Field(i), code, path+"."+f.Name); ok {
				return p, true
			}
		}
	case reflect.Slice:
		for i := range v.Len() {
			if p, ok := findCode(v.Index(i), code, fmt.Sprintf("%s[%d]", path, i)); ok {
				return p, true
			}
		}
	case reflect.Pointer:
		if !v.IsNil() {
			return findCode(v.Elem(), code, path)
		}
	}
	return "", false
}
