// A loopback receiver that checks what eventide sends with Alertmanager's own code: each POST to /api/v2/alerts is
// decoded into Alertmanager's API model (models.PostableAlerts) and validated by its Validate, each POST to
// /webhook into the webhook notifier's message type (notify/webhook.Message), refusing unknown fields. It answers
// 200 to a valid body and 400 with the reason otherwise; GET /received lists what came, in order, as JSON.
//
//	go run . 127.0.0.1:PORT
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"sync"

	"github.com/go-openapi/strfmt"
	"github.com/prometheus/alertmanager/api/v2/models"
	"github.com/prometheus/alertmanager/notify/webhook"
)

type received struct {
	Path  string          `json:"path"`
	Valid bool            `json:"valid"`
	Error string          `json:"error,omitempty"`
	Body  json.RawMessage `json:"body"`
}

var (
	mu   sync.Mutex
	seen []received
)

func strict(body []byte, into any) error {
	decoder := json.NewDecoder(bytes.NewReader(body))
	decoder.DisallowUnknownFields()
	if err := decoder.Decode(into); err != nil {
		return err
	}
	if decoder.More() {
		return fmt.Errorf("data after the JSON value")
	}
	return nil
}

func check(path string, body []byte) error {
	switch path {
	case "/api/v2/alerts":
		var alerts models.PostableAlerts
		if err := strict(body, &alerts); err != nil {
			return err
		}
		return alerts.Validate(strfmt.Default)
	case "/webhook":
		var message webhook.Message
		if err := strict(body, &message); err != nil {
			return err
		}
		if message.Version != "4" {
			return fmt.Errorf("version %q, not 4", message.Version)
		}
		if message.Data == nil || len(message.Alerts) == 0 {
			return fmt.Errorf("no alerts")
		}
		for _, a := range message.Alerts {
			if a.Status != "firing" && a.Status != "resolved" {
				return fmt.Errorf("alert status %q", a.Status)
			}
			if a.Fingerprint == "" || a.StartsAt.IsZero() {
				return fmt.Errorf("alert without fingerprint or startsAt")
			}
		}
		return nil
	}
	return fmt.Errorf("no such path %s", path)
}

func main() {
	http.HandleFunc("/received", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(append([]received{}, seen...))
	})
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		err = check(r.URL.Path, body)
		entry := received{Path: r.URL.Path, Valid: err == nil, Body: body}
		if !json.Valid(body) {
			entry.Body = nil
		}
		if err != nil {
			entry.Error = err.Error()
		}
		mu.Lock()
		seen = append(seen, entry)
		mu.Unlock()
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	fmt.Fprintln(os.Stderr, "listening on", os.Args[1])
	log.Fatal(http.ListenAndServe(os.Args[1], nil))
}
