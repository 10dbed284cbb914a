package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
)

// Routes adds the registry's REST API, the subset of the Confluent Schema
// Registry's that the common serializers use, to mux.
func Routes(mux *http.ServeMux, store *Store, log *slog.Logger) {
	a := &api{store: store, log: log}
	for pattern, h := range map[string]handler{
		"GET /subjects":                                             a.subjects,
		"POST /subjects/{subject}/versions":                         a.register,
		"POST /subjects/{subject}":                                  a.lookup,
		"GET /subjects/{subject}/versions":                          a.versions,
		"GET /subjects/{subject}/versions/{version}":                a.version,
		"DELETE /subjects/{subject}":                                a.deleteSubject,
		"DELETE /subjects/{subject}/versions/{version}":             a.deleteVersion,
		"GET /schemas/ids/{id}":                                     a.schemaByID,
		"POST /compatibility/subjects/{subject}/versions/{version}": a.compatibility,
		"POST /compatibility/subjects/{subject}/versions":           a.compatibility,
		"GET /config":              a.getConfig,
		"PUT /config":              a.putConfig,
		"GET /config/{subject}":    a.getConfig,
		"PUT /config/{subject}":    a.putConfig,
		"DELETE /config/{subject}": a.deleteConfig,
		"GET /schemas/types": func(*http.Request) (any, error) {
			return []string{TypeAvro, TypeJSON, TypeProtobuf}, nil
		},
		"GET /mode": func(*http.Request) (any, error) {
			return map[string]string{"mode": "READWRITE"}, nil
		},
	} {
		mux.HandleFunc(pattern, a.serve(h))
	}
	mux.HandleFunc("GET /subjects/{subject}/versions/{version}/schema", a.serveRaw(a.getVersion))
	mux.HandleFunc("GET /schemas/ids/{id}/schema", a.serveRaw(a.byID))
}

type api struct {
	store *Store
	log   *slog.Logger
}

const contentType = "application/vnd.schemaregistry.v1+json"

func reply(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(body)
}

// fail answers with the API's error body; an error that is not a registry
// error (Postgres unreachable) is a 500 with code 50001, logged.
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	var re *Error
	if !errors.As(err, &re) {
		a.log.Error("schema registry request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		re = &Error{Status: http.StatusInternalServerError, Code: 50001, Msg: "error in the backend data store (logged by the relay)"}
	}
	reply(w, re.Status, map[string]any{"error_code": re.Code, "message": re.Error()})
}

// schemaRequest is the body of register, look-up and compatibility
// requests. Unknown fields (metadata, ruleSet, ...) are ignored.
type schemaRequest struct {
	Schema     string            `json:"schema"`
	SchemaType string            `json:"schemaType"`
	References []json.RawMessage `json:"references"`
}

func readSchema(r *http.Request) (schemaRequest, error) {
	var req schemaRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	if err != nil {
		return req, err
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return req, &Error{Status: http.StatusUnprocessableEntity, Code: codeInvalidSchema, Msg: "the request body is not JSON with a \"schema\" string: " + err.Error()}
	}
	if req.Schema == "" {
		return req, &Error{Status: http.StatusUnprocessableEntity, Code: codeInvalidSchema, Msg: "the request has no \"schema\""}
	}
	if len(req.References) > 0 {
		return req, &Error{Status: http.StatusUnprocessableEntity, Code: codeInvalidSchema, Msg: "schema references are not supported by this registry"}
	}
	return req, nil
}

func flag(r *http.Request, name string) bool {
	b, _ := strconv.ParseBool(r.URL.Query().Get(name))
	return b
}

func versionArg(r *http.Request) (int, error) {
	s := r.PathValue("version")
	if s == "" || s == "latest" || s == "-1" {
		return Latest, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		return 0, &Error{Status: http.StatusUnprocessableEntity, Code: codeInvalidVersion, Msg: fmt.Sprintf("%q is not a version: a positive number or \"latest\"", s)}
	}
	return v, nil
}

// versionBody is a version as the API shows it; schemaType is left out
// for Avro, as Confluent's registry does.
func versionBody(v Version) map[string]any {
	b := map[string]any{"subject": v.Subject, "version": v.Version, "id": v.ID, "schema": v.Schema}
	if v.Type != TypeAvro {
		b["schemaType"] = v.Type
	}
	return b
}

// handler answers a request with a JSON body, or an error for fail.
type handler func(r *http.Request) (any, error)

// serve adapts h to the mux: its body with 200, or its error's body.
func (a *api) serve(h handler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := h(r)
		if err != nil {
			a.fail(w, r, err)
			return
		}
		reply(w, http.StatusOK, body)
	}
}

// serveRaw answers with the schema text of the version that find returns,
// as the /schema endpoints do.
func (a *api) serveRaw(find func(r *http.Request) (Version, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := find(r)
		if err != nil {
			a.fail(w, r, err)
			return
		}
		w.Header().Set("Content-Type", contentType)
		io.WriteString(w, v.Schema)
	}
}

func (a *api) subjects(r *http.Request) (any, error) {
	return a.store.Subjects(r.Context(), flag(r, "deleted"))
}

func (a *api) register(r *http.Request) (any, error) {
	req, err := readSchema(r)
	if err != nil {
		return nil, err
	}
	v, err := a.store.Register(r.Context(), r.PathValue("subject"), req.SchemaType, req.Schema)
	return map[string]any{"id": v.ID}, err
}

func (a *api) lookup(r *http.Request) (any, error) {
	req, err := readSchema(r)
	if err != nil {
		return nil, err
	}
	v, err := a.store.Lookup(r.Context(), r.PathValue("subject"), req.SchemaType, req.Schema, flag(r, "deleted"))
	return versionBody(v), err
}

func (a *api) versions(r *http.Request) (any, error) {
	vs, err := a.store.Versions(r.Context(), r.PathValue("subject"), flag(r, "deleted"))
	nums := make([]int, len(vs))
	for i, v := range vs {
		nums[i] = v.Version
	}
	return nums, err
}

func (a *api) getVersion(r *http.Request) (Version, error) {
	n, err := versionArg(r)
	if err != nil {
		return Version{}, err
	}
	return a.store.Get(r.Context(), r.PathValue("subject"), n, flag(r, "deleted"))
}

func (a *api) version(r *http.Request) (any, error) {
	v, err := a.getVersion(r)
	return versionBody(v), err
}

func (a *api) deleteSubject(r *http.Request) (any, error) {
	return a.store.DeleteSubject(r.Context(), r.PathValue("subject"), flag(r, "permanent"))
}

func (a *api) deleteVersion(r *http.Request) (any, error) {
	n, err := versionArg(r)
	if err != nil {
		return nil, err
	}
	return a.store.DeleteVersion(r.Context(), r.PathValue("subject"), n, flag(r, "permanent"))
}

func (a *api) byID(r *http.Request) (Version, error) {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil {
		return Version{}, errorf(http.StatusNotFound, codeSchemaNotFound, "schema %q not found", r.PathValue("id"))
	}
	return a.store.SchemaByID(r.Context(), id)
}

func (a *api) schemaByID(r *http.Request) (any, error) {
	v, err := a.byID(r)
	b := map[string]any{"schema": v.Schema}
	if v.Type != TypeAvro {
		b["schemaType"] = v.Type
	}
	return b, err
}

func (a *api) compatibility(r *http.Request) (any, error) {
	req, err := readSchema(r)
	if err != nil {
		return nil, err
	}
	n, err := versionArg(r)
	if err != nil {
		return nil, err
	}
	vs, _, err := a.store.Compatible(r.Context(), r.PathValue("subject"), n, req.SchemaType, req.Schema)
	body := map[string]any{"is_compatible": len(vs) == 0}
	if flag(r, "verbose") {
		msgs := make([]string, len(vs))
		for i, v := range vs {
			msgs[i] = v.String()
		}
		body["messages"] = msgs
	}
	return body, err
}

// getConfig answers GET /config and GET /config/{subject}. A subject
// without a level of its own is a 404 (code 40408) unless defaultToGlobal
// is set, as in Confluent's registry: some clients rely on it.
func (a *api) getConfig(r *http.Request) (any, error) {
	subject := r.PathValue("subject")
	level, ok, err := a.store.Config(r.Context(), subject)
	if err != nil {
		return nil, err
	}
	if !ok {
		if subject != "" && !flag(r, "defaultToGlobal") {
			return nil, errorf(http.StatusNotFound, codeNoSubjectConfig, "subject %q does not have a compatibility level of its own", subject)
		}
		level, err = a.store.Level(r.Context(), "")
	}
	return map[string]string{"compatibilityLevel": level}, err
}

func (a *api) putConfig(r *http.Request) (any, error) {
	var req struct {
		Compatibility string `json:"compatibility"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		return nil, &Error{Status: http.StatusUnprocessableEntity, Code: codeInvalidLevel, Msg: "the request body is not JSON with a \"compatibility\" string"}
	}
	if err := a.store.SetConfig(r.Context(), r.PathValue("subject"), req.Compatibility); err != nil {
		return nil, err
	}
	l, _ := ParseLevel(req.Compatibility)
	return map[string]string{"compatibility": l}, nil
}

func (a *api) deleteConfig(r *http.Request) (any, error) {
	level, err := a.store.DeleteConfig(r.Context(), r.PathValue("subject"))
	return map[string]string{"compatibilityLevel": level}, err
}
