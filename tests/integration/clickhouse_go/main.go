// A ClickHouse client check with ClickHouse's own Go driver (clickhouse-go v2), connecting over HTTP exactly as
// Grafana's ClickHouse data source does in HTTP mode. It reads one JSON object on stdin:
//
//	{"addr": "host:port", "user": "...", "password": "...", "database": "...",
//	 "settings": {"max_execution_time": 60}, "queries": ["SQL", ...]}
//
// and prints JSON lines on stdout: first {"ping": null|"error", "server_version": {...}|null, "error"?: "..."},
// then one {"query", "columns", "types", "rows", "error"} per query. Errors are data: the exit code is 0 unless
// the input is not valid JSON (2).
//
//	go build -o bin/chgo . && echo '{...}' | bin/chgo
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/big"
	"os"
	"reflect"
	"strconv"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
)

type input struct {
	Addr     string         `json:"addr"`
	User     string         `json:"user"`
	Password string         `json:"password"`
	Database string         `json:"database"`
	Settings map[string]any `json:"settings"`
	Queries  []string       `json:"queries"`
}

type queryResult struct {
	Query   string   `json:"query"`
	Columns []string `json:"columns"`
	Types   []string `json:"types"`
	Rows    [][]any  `json:"rows"`
	Error   *string  `json:"error"`
}

const maxExact = 1 << 53

var (
	timeType   = reflect.TypeOf(time.Time{})
	bigIntType = reflect.TypeOf(big.Int{})
	stringer   = reflect.TypeOf((*fmt.Stringer)(nil)).Elem()
)

func errText(err error) *string {
	if err == nil {
		return nil
	}
	s := err.Error()
	return &s
}

func bigValue(b *big.Int) any {
	if b.IsInt64() {
		return intValue(b.Int64())
	}
	return b.String()
}

func intValue(i int64) any {
	if i > -maxExact && i < maxExact {
		return i
	}
	return strconv.FormatInt(i, 10)
}

func floatValue(f float64, bits int) any {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	// The shortest decimal that reads back as the same float32/float64, so 0.1 in a Float32 is 0.1 in Python.
	return json.Number(strconv.FormatFloat(f, 'g', -1, bits))
}

// toJSON turns a scanned value into something encoding/json writes and Python compares naturally.
func toJSON(v reflect.Value) any {
	if !v.IsValid() {
		return nil
	}
	t := v.Type()
	switch {
	case t == timeType:
		return v.Interface().(time.Time).UTC().Format(time.RFC3339Nano)
	case t == bigIntType:
		b := v.Interface().(big.Int)
		return bigValue(&b)
	case t.Kind() == reflect.Pointer && t.Elem() == bigIntType:
		if v.IsNil() {
			return nil
		}
		return bigValue(v.Interface().(*big.Int))
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return toJSON(v.Elem())
	}
	// Named types with their own text (UUID, Decimal, net.IP, ...), but not plain strings, numbers or maps.
	if t.PkgPath() != "" && t.Implements(stringer) && t.Kind() != reflect.Map {
		return v.Interface().(fmt.Stringer).String()
	}
	switch t.Kind() {
	case reflect.Bool:
		return v.Bool()
	case reflect.String:
		return v.String()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return intValue(v.Int())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := v.Uint()
		if u < maxExact {
			return int64(u)
		}
		return strconv.FormatUint(u, 10)
	case reflect.Float32:
		return floatValue(v.Float(), 32)
	case reflect.Float64:
		return floatValue(v.Float(), 64)
	case reflect.Slice:
		if v.IsNil() {
			return nil
		}
		if t.Elem().Kind() == reflect.Uint8 {
			return string(v.Bytes())
		}
		fallthrough
	case reflect.Array:
		out := make([]any, v.Len())
		for i := range out {
			out[i] = toJSON(v.Index(i))
		}
		return out
	case reflect.Map:
		if v.IsNil() {
			return nil
		}
		out := make(map[string]any, v.Len())
		iter := v.MapRange()
		for iter.Next() {
			key := toJSON(iter.Key())
			ks, ok := key.(string)
			if !ok {
				ks = fmt.Sprint(key)
			}
			out[ks] = toJSON(iter.Value())
		}
		return out
	}
	return fmt.Sprint(v.Interface())
}

func emit(out *json.Encoder, v any) {
	if err := out.Encode(v); err != nil {
		// Should not happen: every value passed through toJSON. Report it as data rather than crash.
		_ = out.Encode(map[string]string{"encode_error": err.Error()})
	}
}

func runQuery(ctx context.Context, conn clickhouse.Conn, q string) queryResult {
	res := queryResult{Query: q, Columns: []string{}, Types: []string{}, Rows: [][]any{}}
	rows, err := conn.Query(ctx, q)
	if err != nil {
		res.Error = errText(err)
		return res
	}
	defer rows.Close()
	cols := rows.ColumnTypes()
	for _, c := range cols {
		res.Columns = append(res.Columns, c.Name())
		res.Types = append(res.Types, c.DatabaseTypeName())
	}
	for rows.Next() {
		dest := make([]any, len(cols))
		for i, c := range cols {
			dest[i] = reflect.New(c.ScanType()).Interface()
		}
		if err := rows.Scan(dest...); err != nil {
			res.Error = errText(fmt.Errorf("scan: %w", err))
			return res
		}
		row := make([]any, len(cols))
		for i, d := range dest {
			row[i] = toJSON(reflect.ValueOf(d).Elem())
		}
		res.Rows = append(res.Rows, row)
	}
	if err := rows.Err(); err != nil {
		res.Error = errText(err)
	}
	return res
}

func main() {
	raw, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "reading stdin:", err)
		os.Exit(2)
	}
	var in input
	decoder := json.NewDecoder(bytes.NewReader(raw))
	decoder.UseNumber()
	if err := decoder.Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "bad input JSON:", err)
		os.Exit(2)
	}
	settings := clickhouse.Settings{}
	for k, v := range in.Settings {
		if n, ok := v.(json.Number); ok {
			if i, err := n.Int64(); err == nil {
				v = i
			} else if f, err := n.Float64(); err == nil {
				v = f
			}
		}
		settings[k] = v
	}

	out := json.NewEncoder(os.Stdout)
	out.SetEscapeHTML(false)

	conn, err := clickhouse.Open(&clickhouse.Options{
		Protocol:    clickhouse.HTTP,
		Addr:        []string{in.Addr},
		Auth:        clickhouse.Auth{Database: in.Database, Username: in.User, Password: in.Password},
		Settings:    settings,
		DialTimeout: 10 * time.Second,
	})
	if err != nil {
		emit(out, map[string]any{"ping": err.Error(), "server_version": nil, "error": "open: " + err.Error()})
		for _, q := range in.Queries {
			emit(out, queryResult{Query: q, Columns: []string{}, Types: []string{}, Rows: [][]any{}, Error: errText(err)})
		}
		return
	}
	defer conn.Close()
	ctx := context.Background()

	head := map[string]any{"ping": errText(conn.Ping(ctx))}
	if sv, err := conn.ServerVersion(); err != nil {
		head["server_version"] = nil
		head["error"] = err.Error()
	} else {
		tz := ""
		if sv.Timezone != nil {
			tz = sv.Timezone.String()
		}
		head["server_version"] = map[string]any{
			"name":     sv.Name,
			"version":  sv.Version.String(),
			"revision": sv.Revision,
			"timezone": tz,
		}
	}
	emit(out, head)

	for _, q := range in.Queries {
		emit(out, runQuery(ctx, conn, q))
	}
}
