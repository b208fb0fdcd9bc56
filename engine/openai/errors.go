package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/kvstrata/kvstrata/engine/sched"
)

// apiError is an error answer: vLLM's ErrorResponse,
// {"error": {"message", "type", "param", "code"}} with code the HTTP status.
type apiError struct {
	Status  int
	Type    string
	Message string
	Param   string
}

func (e *apiError) Error() string { return e.Message }

// errorBody is an error's JSON shape.
type errorBody struct {
	Error errorInfo `json:"error"`
}

type errorInfo struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    int     `json:"code"`
}

func (e *apiError) body() errorBody {
	b := errorBody{Error: errorInfo{Message: e.Message, Type: e.Type, Code: e.Status}}
	if e.Param != "" {
		b.Error.Param = &e.Param
	}
	return b
}

// badRequest is a 400 about param (may be empty).
func badRequest(param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "BadRequestError", Param: param, Message: fmt.Sprintf(format, args...)}
}

// httpError is an error about the HTTP exchange itself (method, path,
// size), typed as vLLM types them: with the status's phrase.
func httpError(status int, format string, args ...any) *apiError {
	return &apiError{Status: status, Type: http.StatusText(status), Message: fmt.Sprintf(format, args...)}
}

// modelNotFound is vLLM's answer to a model it does not serve.
func modelNotFound(model string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: "NotFoundError", Param: "model",
		Message: fmt.Sprintf("The model `%s` does not exist.", model)}
}

// engineError maps an engine error to its answer: the request's fault is a
// 400, a full or closing engine a 503, anything else a 500.
func engineError(err error) *apiError {
	switch {
	case errors.Is(err, sched.ErrBadRequest), errors.Is(err, sched.ErrTooLong):
		return &apiError{Status: http.StatusBadRequest, Type: "BadRequestError", Message: err.Error()}
	case errors.Is(err, sched.ErrOverloaded), errors.Is(err, sched.ErrClosed):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "ServiceUnavailableError", Message: err.Error()}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &apiError{Status: http.StatusServiceUnavailable, Type: "ServiceUnavailableError", Message: "request cancelled: " + err.Error()}
	default:
		return &apiError{Status: http.StatusInternalServerError, Type: "InternalServerError", Message: err.Error()}
	}
}

// logFailure logs the failure of the engine request id. One the client
// caused — it left (ctx is done), or the engine found its request bad (a
// 4xx) — is no fault of the server's and goes at debug level, so that
// clients that abandon their streams or send bad requests, however many,
// do not fill the log with warnings.
func (s *Server) logFailure(ctx context.Context, msg, id string, err error) {
	level := slog.LevelWarn
	if ctx.Err() != nil || engineError(err).Status < http.StatusInternalServerError {
		level = slog.LevelDebug
	}
	s.cfg.Logger.Log(ctx, level, msg, "id", id, "err", err)
}

// writeError answers e as JSON with its status.
// A 503 says when to retry: a second from now.
func writeError(w http.ResponseWriter, e *apiError) {
	if e.Status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, e.Status, e.body())
}

// writeJSON answers v as JSON with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"encoding the response failed","type":"InternalServerError","param":null,"code":500}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
