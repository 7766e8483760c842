//! Root package: owns tests/ and benches/.
