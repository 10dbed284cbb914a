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
	mux.HandleFunc("GET /subjects", a.subjects)
	mux.HandleFunc("POST /subjects/{subject}/versions", a.register)
	mux.HandleFunc("POST /subjects/{subject}", a.lookup)
	mux.HandleFunc("GET /subjects/{subject}/versions", a.versions)
	mux.HandleFunc("GET /subjects/{subject}/versions/{version}", a.version)
	mux.HandleFunc("GET /subjects/{subject}/versions/{version}/schema", a.versionSchema)
	mux.HandleFunc("DELETE /subjects/{subject}", a.deleteSubject)
	mux.HandleFunc("DELETE /subjects/{subject}/versions/{version}", a.deleteVersion)
	mux.HandleFunc("GET /schemas/ids/{id}", a.schemaByID)
	mux.HandleFunc("GET /schemas/ids/{id}/schema", a.schemaByIDRaw)
	mux.HandleFunc("GET /schemas/types", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, http.StatusOK, []string{TypeAvro, TypeJSON, TypeProtobuf})
	})
	mux.HandleFunc("POST /compatibility/subjects/{subject}/versions/{version}", a.compatibility)
	mux.HandleFunc("POST /compatibility/subjects/{subject}/versions", a.compatibility)
	mux.HandleFunc("GET /config", a.getConfig)
	mux.HandleFunc("PUT /config", a.putConfig)
	mux.HandleFunc("GET /config/{subject}", a.getConfig)
	mux.HandleFunc("PUT /config/{subject}", a.putConfig)
	mux.HandleFunc("DELETE /config/{subject}", a.deleteConfig)
	mux.HandleFunc("GET /mode", func(w http.ResponseWriter, _ *http.Request) {
		reply(w, http.StatusOK, map[string]string{"mode": "READWRITE"})
	})
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

func (a *api) subjects(w http.ResponseWriter, r *http.Request) {
	subjects, err := a.store.Subjects(r.Context(), flag(r, "deleted"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	reply(w, http.StatusOK, subjects)
}

func (a *api) register(w http.ResponseWriter, r *http.Request) {
	req, err := readSchema(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	v, err := a.store.Register(r.Context(), r.PathValue("subject"), req.SchemaType, req.Schema)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	reply(w, http.StatusOK, map[string]any{"id": v.ID})
}

func (a *api) lookup(w http.ResponseWriter, r *http.Request) {
	req, err := readSchema(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	v, err := a.store.Lookup(r.Context(), r.PathValue("subject"), req.SchemaType, req.Schema, flag(r, "deleted"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	reply(w, http.StatusOK, versionBody(v))
}

func (a *api) versions(w http.ResponseWriter, r *http.Request) {
	vs, err := a.store.Versions(r.Context(), r.PathValue("subject"), flag(r, "deleted"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	nums := make([]int, len(vs))
	for i, v := range vs {
		nums[i] = v.Version
	}
	reply(w, http.StatusOK, nums)
}

func (a *api) getVersion(w http.ResponseWriter, r *http.Request) (Version, bool) {
	n, err := versionArg(r)
	if err == nil {
		var v Version
		if v, err = a.store.Get(r.Context(), r.PathValue("subject"), n, flag(r, "deleted")); err == nil {
			return v, true
		}
	}
	a.fail(w, r, err)
	return Version{}, false
}

func (a *api) version(w http.ResponseWriter, r *http.Request) {
	if v, ok := a.getVersion(w, r); ok {
		reply(w, http.StatusOK, versionBody(v))
	}
}

func (a *api) versionSchema(w http.ResponseWriter, r *http.Request) {
	if v, ok := a.getVersion(w, r); ok {
		w.Header().Set("Content-Type", contentType)
		io.WriteString(w, v.Schema)
	}
}

func (a *api) deleteSubject(w http.ResponseWriter, r *http.Request) {
	vs, err := a.store.DeleteSubject(r.Context(), r.PathValue("subject"), flag(r, "permanent"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	reply(w, http.StatusOK, vs)
}

func (a *api) deleteVersion(w http.ResponseWriter, r *http.Request) {
	n, err := versionArg(r)
	if err == nil {
		n, err = a.store.DeleteVersion(r.Context(), r.PathValue("subject"), n, flag(r, "permanent"))
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	reply(w, http.StatusOK, n)
}

func (a *api) byID(w http.ResponseWriter, r *http.Request) (Version, bool) {
	id, err := strconv.Atoi(r.PathValue("id"))
	if err != nil {
		a.fail(w, r, errorf(http.StatusNotFound, codeSchemaNotFound, "schema %q not found", r.PathValue("id")))
		return Version{}, false
	}
	v, err := a.store.SchemaByID(r.Context(), id)
	if err != nil {
		a.fail(w, r, err)
		return Version{}, false
	}
	return v, true
}

func (a *api) schemaByID(w http.ResponseWriter, r *http.Request) {
	if v, ok := a.byID(w, r); ok {
		b := map[string]any{"schema": v.Schema}
		if v.Type != TypeAvro {
			b["schemaType"] = v.Type
		}
		reply(w, http.StatusOK, b)
	}
}

func (a *api) schemaByIDRaw(w http.ResponseWriter, r *http.Request) {
	if v, ok := a.byID(w, r); ok {
		w.Header().Set("Content-Type", contentType)
		io.WriteString(w, v.Schema)
	}
}

func (a *api) compatibility(w http.ResponseWriter, r *http.Request) {
	req, err := readSchema(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	n, err := versionArg(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	vs, _, err := a.store.Compatible(r.Context(), r.PathValue("subject"), n, req.SchemaType, req.Schema)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	body := map[string]any{"is_compatible": len(vs) == 0}
	if flag(r, "verbose") {
		msgs := make([]string, len(vs))
		for i, v := range vs {
			msgs[i] = v.String()
		}
		body["messages"] = msgs
	}
	reply(w, http.StatusOK, body)
}

// getConfig answers GET /config and GET /config/{subject}. A subject
// without a level of its own is a 404 (code 40408) unless defaultToGlobal
// is set, as in Confluent's registry: some clients rely on it.
func (a *api) getConfig(w http.ResponseWriter, r *http.Request) {
	subject := r.PathValue("subject")
	level, ok, err := a.store.Config(r.Context(), subject)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if !ok {
		if subject != "" && !flag(r, "defaultToGlobal") {
			a.fail(w, r, errorf(http.StatusNotFound, codeNoSubjectConfig, "subject %q does not have a compatibility level of its own", subject))
			return
		}
		if level, err = a.store.Level(r.Context(), ""); err != nil {
			a.fail(w, r, err)
			return
		}
	}
	reply(w, http.StatusOK, map[string]string{"compatibilityLevel": level})
}

func (a *api) putConfig(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Compatibility string `json:"compatibility"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		a.fail(w, r, &Error{Status: http.StatusUnprocessableEntity, Code: codeInvalidLevel, Msg: "the request body is not JSON with a \"compatibility\" string"})
		return
	}
	if err := a.store.SetConfig(r.Context(), r.PathValue("subject"), req.Compatibility); err != nil {
		a.fail(w, r, err)
		return
	}
	l, _ := ParseLevel(req.Compatibility)
	reply(w, http.StatusOK, map[string]string{"compatibility": l})
}

func (a *api) deleteConfig(w http.ResponseWriter, r *http.Request) {
	level, err := a.store.DeleteConfig(r.Context(), r.PathValue("subject"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	reply(w, http.StatusOK, map[string]string{"compatibilityLevel": level})
}
