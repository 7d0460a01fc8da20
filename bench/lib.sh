# Shared by the bench scripts (sourced).

# remap_bootstrap OUT ADMIN STATUS AGENT INBOUND APP PROM: writes
# config/envoy-bootstrap.yaml to OUT with its ports remapped and its
# listeners on 127.0.0.1 instead of 0.0.0.0.
remap_bootstrap() {
  sed -e 's/0\.0\.0\.0/127.0.0.1/g' \
      -e "s/port_value: 15000 /port_value: $2 /" -e "s/port_value: 15021 /port_value: $3 /" \
      -e "s/port_value: 15020 /port_value: $4 /" -e "s/port_value: 15006 /port_value: $5 /" \
      -e "s/port_value: 8080 /port_value: $6 /" -e "s/port_value: 15090 /port_value: $7 /" \
      config/envoy-bootstrap.yaml > "$1"
}
